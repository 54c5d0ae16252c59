"""What a hung DDP launch is reported with (torchkiln.verify.hang), on this machine's real interfaces and
resolver: the deadline's variable, the interface choices that name nothing, the report's last lines."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

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
