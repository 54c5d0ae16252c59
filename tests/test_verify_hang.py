"""What a hung DDP launch is reported with (torchkiln.verify.hang), on this machine's real interfaces and
resolver: the deadline's variable, the interface choices that name nothing, the report's last lines."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from torchkiln.verify import hang


def test_the_deadline_comes_from_its_variable() -> None:
    assert hang.launch_deadline({}) == hang.DEFAULT_DEADLINE_S == 120.0
    assert hang.launch_deadline({"TORCHKILN_VERIFY_DDP_TIMEOUT": "7.5"}) == 7.5
    for bad in ("soon", "0", "-3", "nan", "inf"):
        with pytest.raises(ValueError, match=rf"TORCHKILN_VERIFY_DDP_TIMEOUT='{bad}': not a positive number"):
            hang.launch_deadline({"TORCHKILN_VERIFY_DDP_TIMEOUT": bad})


def test_socket_ifname_naming_no_interface_is_a_cause() -> None:
    names = [name for _, name in socket.if_nameindex()]
    assert "lo" in names
    assert hang.interface_problems({"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "^docker,lo"}) == []
    assert hang.interface_problems({"NCCL_SOCKET_IFNAME": "l"}) == []  # NCCL matches prefixes
    (problem,) = hang.interface_problems({"GLOO_SOCKET_IFNAME": "l"})  # gloo takes exact names
    assert problem.startswith("GLOO_SOCKET_IFNAME=l: no interface l on this machine (it has ")
    (problem,) = hang.interface_problems({"NCCL_SOCKET_IFNAME": "=kiln9,lo"})
    assert problem.startswith("NCCL_SOCKET_IFNAME==kiln9,lo: no interface kiln9 on this machine")


def test_resolution_of_a_name_that_cannot_resolve() -> None:
    assert hang._resolve("localhost", 10) is None
    problem = hang._resolve("kiln-verify.invalid", 10)  # RFC 2606: never resolves
    assert problem is not None and problem.startswith("getaddrinfo"), problem


def test_report_names_cause_and_last_distinct_lines() -> None:
    warning = "UserWarning: Failed to initialize NumPy"
    stderr = "\n".join([warning, "c10d line 1", warning, "", "c10d line 2", warning])
    text = hang.report("torchrun --standalone", "rank 1: sleeping\n", stderr, 10, ["the cause"])
    assert text.splitlines() == [
        "torchrun --standalone hung: not finished within the DDP launches' 10 s deadline "
        "($TORCHKILN_VERIFY_DDP_TIMEOUT; killed with its workers); likely cause: the cause.",
        "Last lines on stderr:",
        "  c10d line 1",
        "  c10d line 2",
        f"  {warning}",
        "Last lines on stdout:",
        "  rank 1: sleeping",
    ]
    assert "no cause found here" in hang.report("x", "", "", 10, [])


def test_a_bad_deadline_is_a_usage_error_before_anything_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "torchkiln", "verify", "--area", "ddp"],
        env={**os.environ, "TORCHKILN_VERIFY_DDP_TIMEOUT": "soon"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert (
        done.stderr
        == "TORCHKILN_VERIFY_DDP_TIMEOUT='soon': not a positive number of seconds (valid: e.g. 120)\n"
    )


@pytest.mark.parametrize("frames", [0, 1, 15, 40])
def test_a_cpp_stack_trace_does_not_push_c10ds_words_out(frames: int) -> None:
    """What torchrun printed on a machine whose hostname does not resolve (CI, 27 Nov 2026): c10d's warning,
    then an error with up to 40 C++ frames; the report keeps the warning and the error, not the frames."""
    host = "kiln-verify.invalid"
    warning = f"[W1127 21:40:00.1 socket.cpp:767] [c10d] The IPv6 network addresses of ({host}, 29500) cannot be retrieved (gai error: -2 - Name or service not known)."
    error = "torch.distributed.DistNetworkError: wait timeout after 10000ms"
    trace = [
        f"frame #{i}: c10d::TCPStore::doWait(c10::ArrayRef<std::string>) + 0xc5 (0x7fddc4142d35 in /x/libtorch_cpu.so)"
        for i in range(frames)
    ]
    stderr = "\n".join(
        [
            warning,
            error,
            "Exception raised from doWait at tcpstore.cpp:1:",
            *trace[:10],
            "<omitting python frames>",
            *trace[10:],
        ]
    )
    text = hang.report("two-node torchrun", "", stderr, 10, ["the hostname"])
    assert warning in text and error in text
    assert "frame #" not in text and "<omitting python frames>" not in text


# --- the causes a hung launch is reported with, each from a real fault ---------------------------------------

STORE = """\
import datetime, sys
import torch.distributed as dist
host, port, master = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
try:
    dist.TCPStore(host, port, is_master=master, timeout=datetime.timedelta(seconds=3), wait_for_workers=False)
except Exception as exc:
    print(f"{type(exc).__module__}.{type(exc).__name__}: {exc}", file=sys.stderr)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _c10d(
    tmp_path: Path, host: str, port: int, master: bool, prefix: tuple[str, ...] = ()
) -> tuple[str, str]:
    """What torch's c10d store prints meeting ``host:port`` (its own words: the ranks print the same)."""
    script = tmp_path / "store.py"
    script.write_text(STORE)
    done = subprocess.run(
        [*prefix, sys.executable, str(script), host, str(port), "1" if master else "0"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return done.stdout, done.stderr


def _can_unshare_net() -> bool:
    return subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False).returncode == 0


def _held(kind: str) -> socket.socket:
    """A port another process would hold: listening (and never answering), or bound only."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    if kind == "listening":
        sock.listen(1)
    return sock


@pytest.mark.integration
@pytest.mark.parametrize(
    ("fault", "words"),
    [
        ("unresolvable host", "(gai error: -2 - Name or service not known)"),
        ("address in use", "name: EADDRINUSE, message: address already in use"),
        (
            "refused connection",
            "The client socket has timed out after 3000ms while trying to connect to (127.0.0.1, ",
        ),
        ("network unreachable", "(errno: 101 - Network is unreachable)"),
    ],
)
def test_the_ranks_first_error_is_the_cause_of_a_real_fault(tmp_path: Path, fault: str, words: str) -> None:
    """c10d's own output under each fault (torch's store, as the ranks make it), reported as a hung launch
    with no other cause found: the cause is its first error line (it was null: "no cause found here")."""
    from kit.imagekit import need_torch, require

    need_torch()
    from torchkiln.verify import report

    held = None
    if fault == "unresolvable host":
        out, err = _c10d(tmp_path, "kiln-verify.invalid", _free_port(), master=False)
    elif fault == "address in use":
        held = _held("listening")
        out, err = _c10d(tmp_path, "127.0.0.1", held.getsockname()[1], master=True)
    elif fault == "refused connection":
        out, err = _c10d(tmp_path, "127.0.0.1", _free_port(), master=False)
    else:
        require(_can_unshare_net(), "unshare -n is not permitted here (a network namespace needs root)")
        out, err = _c10d(tmp_path, "localhost", 29500, master=False, prefix=("unshare", "-n"))
    if held is not None:
        held.close()
    message = hang.report("torchrun --standalone", out, err, 10, [])
    cause = report.cause_line(message)
    assert cause is not None and cause.startswith(hang.FIRST_ERROR) and words in cause, (cause, err[-3000:])
    assert hang.NO_CAUSE not in message


@pytest.mark.parametrize("kind", ["listening", "bound"])
def test_a_rendezvous_port_another_process_holds_is_named_with_it(kind: str) -> None:
    """A silent listener, or a socket bound to the port: torchrun's agents meet it and wait without a word."""
    held = _held(kind)
    port = held.getsockname()[1]
    try:
        (problem,) = hang.endpoint_problems([("127.0.0.1", port)])
    finally:
        held.close()
    taken = f"the rendezvous endpoint 127.0.0.1:{port} is taken by another process ("
    # a listener is named by /proc/net/tcp; a socket only bound is in no table /proc shows
    assert problem.startswith(taken + (f"pid {os.getpid()}: " if kind == "listening" else "which, /proc")), (
        problem
    )
    assert "$TORCHKILN_VERIFY_DDP_PORT" in problem
    assert hang.endpoint_problems([("127.0.0.1", port)]) == []  # once freed


def test_a_port_that_is_no_port_is_refused_by_name() -> None:
    assert hang.launch_port({}) is None and hang.launch_port({"TORCHKILN_VERIFY_DDP_PORT": "29511"}) == 29511
    for bad in ("0", "65536", "http", "-1", "29 500"):
        with pytest.raises(ValueError, match=rf"TORCHKILN_VERIFY_DDP_PORT='{bad}': not a TCP port"):
            hang.launch_port({"TORCHKILN_VERIFY_DDP_PORT": bad})


def test_this_machine_reaches_itself() -> None:
    assert hang.loopback_problems(["localhost", "127.0.0.1"]) == []


def test_a_network_namespace_without_its_loopback_is_named() -> None:
    """unshare -n: a network namespace whose only interface, lo, is down; every connect gets ENETUNREACH."""
    from kit.imagekit import require

    require(_can_unshare_net(), "unshare -n is not permitted here (a network namespace needs root)")
    code = "from torchkiln.verify import hang; print('\\n'.join(hang.likely_causes({})))"
    done = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert "this machine cannot reach itself at localhost, 127.0.0.1" in done.stdout, done.stdout
    assert "Network is unreachable (ENETUNREACH)" in done.stdout and "ip link set lo up" in done.stdout
