"""Bounded subprocess runs for the verification suite, on :mod:`torchkiln.process.runner`.

Every check that starts a process (a fresh interpreter for CUDA_VISIBLE_DEVICES, torchrun with its
workers, a DataLoader with worker processes) goes through here, so none can hang the suite: each run has a
timeout, lives in its own session, and on timeout its whole process group is killed, grandchildren
(torchrun's workers) included; stragglers are killed after a run ends too.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torchkiln.process import runner

# What a run returns: argv, returncode (None: killed after the timeout), stdout, stderr, timed_out,
# output, describe().
Result = runner.Completed


# What the suite controls in the environment of its processes (pytest itself and every helper: the DDP
# workers, the fresh interpreters), so a caller's shell cannot change what a check means:
# - set: the knobs that change numerics or output order (one thread, a fixed hash seed, cuBLAS's
#   deterministic workspace, unbuffered output);
# - removed: torch's debug and logging switches (TORCH_DISTRIBUTED_DEBUG=DETAIL makes gloo's DDP workers
#   crash, an invalid value makes importing torch.distributed fail), the launcher's contract variables
#   (torchrun sets them, the DDP checks test exactly that), and PYTHONSTARTUP;
# - kept: everything else, notably CUDA_VISIBLE_DEVICES (which GPUs to test) and the *_SOCKET_IFNAME
#   network choices a host may need.
WORKER_SET: dict[str, str] = {
    "PYTHONHASHSEED": "0",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "PYTHONUNBUFFERED": "1",
}
WORKER_REMOVED = frozenset(
    {
        "TORCH_DISTRIBUTED_DEBUG",
        "TORCH_CPP_LOG_LEVEL",
        "TORCH_SHOW_CPP_STACKTRACES",
        "TORCH_LOGS",
        "NCCL_DEBUG",
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "ROLE_RANK",
        "PYTHONSTARTUP",
    }
)
WORKER_REMOVED_PREFIXES = ("TORCHELASTIC_",)


def worker_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` under the suite's policy (:data:`WORKER_SET`, :data:`WORKER_REMOVED`)."""
    kept = {
        k: v
        for k, v in environ.items()
        if k not in WORKER_REMOVED and not k.startswith(WORKER_REMOVED_PREFIXES)
    }
    return {**kept, **WORKER_SET}


def start(
    argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | str | None = None
) -> subprocess.Popen[Any]:
    """Start a process in its own session (so its group can be killed) with captured text output."""
    return runner.spawn(argv, env=env, cwd=cwd)


def wait(proc: subprocess.Popen[Any], timeout: float) -> Result:
    """Wait up to ``timeout`` seconds; past it kill the whole process group and report timed_out."""
    return runner.finish(proc, timeout=timeout, reap=True)


def run(
    argv: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
) -> Result:
    """Run to completion or until ``timeout``; never raises for a non-zero exit or a timeout."""
    return wait(start(argv, env=env, cwd=cwd), timeout)


def python(
    script: Path | str,
    *args: str,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
) -> Result:
    """Run a helper script with the interpreter under test (the one that has the torch being verified)."""
    return run([sys.executable, str(script), *args], timeout=timeout, env=env, cwd=cwd)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (for torchrun's --rdzv-endpoint)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
