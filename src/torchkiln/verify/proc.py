"""Bounded subprocess runs for the verification suite, on :mod:`torchkiln.runner`.

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

from .. import runner

# What a run returns: argv, returncode (None: killed after the timeout), stdout, stderr, timed_out,
# output, describe().
Result = runner.Completed


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
