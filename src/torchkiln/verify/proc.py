"""Bounded subprocess runs for the verification suite.

Every check that starts a process (a fresh interpreter for CUDA_VISIBLE_DEVICES, torchrun with its
workers, a DataLoader with worker processes) goes through here, so none can hang the suite: each run has
a timeout, lives in its own session, and on timeout its whole process group is killed, grandchildren
(torchrun's workers) included.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    returncode: int | None  # None: killed after the timeout
    stdout: str
    stderr: str
    timed_out: bool

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def describe(self, tail: int = 4000) -> str:
        state = "timed out" if self.timed_out else f"exited {self.returncode}"
        text = self.output[-tail:]
        return f"{' '.join(self.argv)} {state}\n--- output (tail) ---\n{text}"


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def start(
    argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | str | None = None
) -> subprocess.Popen[str]:
    """Start a process in its own session (so its group can be killed) with captured text output."""
    return subprocess.Popen(
        list(argv),
        env=dict(env) if env is not None else None,
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def wait(proc: subprocess.Popen[str], timeout: float) -> Result:
    """Wait up to ``timeout`` seconds; past it kill the whole process group and report timed_out."""
    try:
        out, err = proc.communicate(timeout=timeout)
        return Result(tuple(proc.args), proc.returncode, out, err, False)  # type: ignore[arg-type]
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        return Result(tuple(proc.args), None, out, err, True)  # type: ignore[arg-type]
    finally:
        _kill_group(proc)  # stragglers too: workers a crashed launcher left behind


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
