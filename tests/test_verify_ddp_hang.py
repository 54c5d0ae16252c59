"""A DDP launch that hangs is reported by the suite, by its deadline, with its cause, and never reaches
pytest-timeout: the real verify suite's DDP area, real torchrun, with a hung worker injected
(``TORCHKILN_VERIFY_HANG_RANK``) or under a hostname that does not resolve (a UTS namespace), and the
launches' deadline shortened (``TORCHKILN_VERIFY_DDP_TIMEOUT``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

DEADLINE = "10"
HUNG = "hung: not finished within the DDP launches' 10 s deadline ($TORCHKILN_VERIFY_DDP_TIMEOUT; killed with its workers)"
LAUNCHES = (
    ("test_standalone_params_identical_across_ranks", "torchrun --standalone"),
    ("test_two_nodes_c10d", "two-node torchrun"),
)


def _environ_has(pid: str, token: str) -> bool:
    try:
        return token.encode() in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or not ours to read
        return False


def run_ddp_area(
    tmp_path: Path, *, prefix: list[str], **env: str
) -> tuple[subprocess.CompletedProcess[str], dict]:
    """``torchkiln verify --area ddp`` (behind ``prefix``), then: no process it started is left."""
    token = f"KILN_DDP_HANG_TEST={uuid.uuid4().hex}"
    name, value = token.split("=")
    out = tmp_path / "report"
    result = subprocess.run(
        [*prefix, sys.executable, "-m", "torchkiln", "verify", "--area", "ddp", "--report", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "TORCHKILN_VERIFY_DDP_TIMEOUT": DEADLINE, name: value, **env},
    )
    left = [p for p in os.listdir("/proc") if p.isdigit() and _environ_has(p, token)]
    assert not left, f"processes of the run survived it: {left}"
    assert "from pytest-timeout" not in result.stdout, result.stdout[-4000:]
    return result, json.loads((out / "summary.json").read_text())


def _failures(summary: dict) -> dict[str, str]:
    return {f["nodeid"].split("::")[-1]: f["message"] for f in summary["failures"]}


def test_a_hung_worker_fails_the_launch_by_its_deadline(tmp_path: Path) -> None:
    result, summary = run_ddp_area(tmp_path, prefix=[], TORCHKILN_VERIFY_HANG_RANK="1")
    assert result.returncode == 1, result.stdout[-4000:] + result.stderr[-2000:]
    failures = _failures(summary)
    for test, what in LAUNCHES:
        message = failures[test]
        assert message.startswith(f"{what} {HUNG}"), message
        # the launcher's last lines: here, what the sleeping worker printed
        assert "rank 1: sleeping instead of joining (TORCHKILN_VERIFY_HANG_RANK)" in message, message


def _can_unshare_uts() -> bool:
    probe = subprocess.run(["unshare", "--uts", "true"], capture_output=True, check=False, timeout=30)
    return probe.returncode == 0


def test_a_hostname_that_does_not_resolve_is_named(tmp_path: Path) -> None:
    """The hang users hit: torchrun's workers look for MASTER_ADDR=<hostname> forever. Reproduced in a UTS
    namespace whose hostname is under .invalid (RFC 2606: never resolves)."""
    if not _can_unshare_uts():
        if os.environ.get("CI") == "true":
            pytest.fail(
                "unshare --uts is not permitted here; CI runs as root and must be able to", pytrace=False
            )
        pytest.skip("needs root (unshare --uts) to give the run a hostname of its own")
    host = "kiln-verify.invalid"
    rename = f"import os, socket, sys; socket.sethostname({host!r}); os.execv(sys.executable, sys.argv[1:])"
    result, summary = run_ddp_area(tmp_path, prefix=["unshare", "--uts", sys.executable, "-c", rename])
    assert result.returncode == 1, result.stdout[-4000:] + result.stderr[-2000:]
    failures = _failures(summary)
    for test, what in LAUNCHES:
        message = failures[test]
        assert message.startswith(
            f"{what} {HUNG}; likely cause: this machine's hostname {host!r} does not resolve"
        )
        # c10d's own words, from the launcher's last lines
        assert f"The IPv6 network addresses of ({host}, " in message and "cannot be retrieved" in message, (
            message
        )
    # summary.json's cause: the unresolvable hostname, for each launch (it was null)
    causes = {f["nodeid"].split("::")[-1]: f["cause"] for f in summary["failures"]}
    for test, _ in LAUNCHES:
        assert causes[test].startswith(f"this machine's hostname {host!r} does not resolve"), causes


def _can_unshare_net() -> bool:
    return (
        subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False, timeout=30).returncode
        == 0
    )


def _causes(summary: dict) -> dict[str, str]:
    return {f["nodeid"].split("::")[-1]: f["cause"] for f in summary["failures"]}


def test_a_network_namespace_without_routes_is_named(tmp_path: Path) -> None:
    """The run of the issue: with the network unreachable (errno 101), the CPU DDP checks failed as hung with
    "no cause found here" and a null cause. In a network namespace (``unshare -n``: only lo, and down) every
    launch's cause now names it, and the ranks' first error line (c10d's errno 101)."""
    if not _can_unshare_net():
        if os.environ.get("CI") == "true":
            pytest.fail(
                "unshare -n is not permitted here; CI runs as root and must be able to", pytrace=False
            )
        pytest.skip("needs root (unshare -n) to run without a network")
    result, summary = run_ddp_area(tmp_path, prefix=["unshare", "-n"])
    assert result.returncode == 1, result.stdout[-4000:] + result.stderr[-2000:]
    causes = _causes(summary)
    hung = {t: c for t, c in causes.items() if t != "test_nccl_standalone"}
    assert len(hung) == 5, causes
    for test, cause in hung.items():
        assert cause.startswith("this machine cannot reach itself at localhost, 127.0.0.1"), (test, cause)
        assert "Network is unreachable (ENETUNREACH)" in cause and "ip link set lo up" in cause, cause
        assert "the ranks' first error: " in cause and "(errno: 101 - Network is unreachable)" in cause, cause
    markdown = (tmp_path / "report" / "summary.md").read_text()
    assert markdown.count("| `this machine cannot reach itself at localhost, 127.0.0.1") == 5, markdown


def test_a_rendezvous_port_another_process_holds_is_named(tmp_path: Path) -> None:
    """A port taken by a process that listens and never answers: the two-node launch's agents connect to it
    as to their store and wait, printing nothing. Its cause names the port and the process."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_PORT], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        port = int(holder.stdout.readline()) if holder.stdout else 0
        result, summary = run_ddp_area(tmp_path, prefix=[], TORCHKILN_VERIFY_DDP_PORT=str(port))
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 1, result.stdout[-4000:] + result.stderr[-2000:]
    cause = _causes(summary)["test_two_nodes_c10d"]
    assert cause.startswith(
        f"the rendezvous endpoint 127.0.0.1:{port} is taken by another process (pid {holder.pid}: "
    ), cause
    assert "$TORCHKILN_VERIFY_DDP_PORT" in cause


HOLD_PORT = """\
import socket, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(8)
print(s.getsockname()[1], flush=True)
time.sleep(3600)
"""
