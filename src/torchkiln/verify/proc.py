"""Bounded subprocess runs for the verification suite, on :mod:`torchkiln.process.runner`.

Every check that starts a process (a fresh interpreter for CUDA_VISIBLE_DEVICES, torchrun with its
workers, a DataLoader with worker processes) goes through here, so none can hang the suite: each run has a
timeout, lives in its own session, and on timeout it and every descendant are killed by process id
(torchrun's workers live in sessions of their own, out of reach of a process-group kill); stragglers of
its group are killed after a run ends too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torchkiln.process import runner

# What a run returns: argv, returncode (None: killed after the timeout), stdout, stderr, timed_out,
# output, describe().
Result = runner.Completed
KILL_MARGIN_S = 10.0  # after the kill at the timeout: time for the pipes to reach end-of-file


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


# Where the suite and every process it starts write (issue 46: verify writes nothing outside its report
# directory and its own temp directory): the temp directory (tempfile, torchrun's error files, pytest's
# tmp_path, and inductor's default cache and precompiled headers, which torch puts under
# tempfile.gettempdir()/torchinductor_<user> whatever TORCHINDUCTOR_CACHE_DIR says) and every cache a check
# fills, each a directory of the suite's own temp directory.
SCRATCH_ENV = "TORCHKILN_VERIFY_SCRATCH"  # the suite's own temp directory, once made
SCRATCH_DIRS: dict[str, str] = {
    "TMPDIR": "tmp",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "TRITON_CACHE_DIR": "triton",
    "PYTORCH_KERNEL_CACHE_PATH": "kernels",
    "CUDA_CACHE_PATH": "cuda",
    "XDG_CACHE_HOME": "cache",
}


# A Unix socket's path holds at most 107 bytes (sockaddr_un.sun_path), and the suite's processes bind sockets
# under TMPDIR: multiprocessing's resource sharer, through which a DataLoader worker hands each batch's file
# descriptors over, at TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX. Under a longer TMPDIR that bind fails in the
# worker's feeder thread and the loader waits forever (CI found it: nox's TMPDIR is .nox/<session>/tmp). So
# the suite's TMPDIR leaves room for that name, and its temp directory is made where it can.
UNIX_PATH_MAX = 107
SOCKET_ROOM = len("/pymp-xxxxxxxx/listener-xxxxxxxx")


def scratch_parent(prefix: str) -> str:
    """Where the suite's own temp directory (``prefix`` + 8 characters, then ``suite/tmp``) is made: the
    system temp directory, else /tmp where the former leaves no room for a socket's name. ValueError when
    neither does."""
    room = len(f"/{prefix}xxxxxxxx/suite/tmp") + SOCKET_ROOM
    candidates = (tempfile.gettempdir(), "/tmp")
    for candidate in candidates:
        if len(os.fsencode(candidate)) + room <= UNIX_PATH_MAX and os.access(candidate, os.W_OK | os.X_OK):
            return candidate
    raise ValueError(
        f"the temp directory {candidates[0]!r} is too long for the Unix sockets the suite's processes make "
        f"under it (at most {UNIX_PATH_MAX - room} bytes) and /tmp is not writable: set TMPDIR to a shorter one"
    )


def scratch_environment(root: Path) -> dict[str, str]:
    """The variables that put every temp file and cache of the suite under ``root`` (made here), and no
    bytecode written beside the suite's or torchkiln's sources (what is compiled already is still read: a
    cache prefix of its own would make every worker compile torch's 3,000 modules again). ValueError when
    ``root``'s temp directory leaves no room for a socket's name under it (:func:`scratch_parent`)."""
    tmp = root / SCRATCH_DIRS["TMPDIR"]
    if len(os.fsencode(str(tmp))) + SOCKET_ROOM > UNIX_PATH_MAX:
        raise ValueError(
            f"{tmp} is too long for a temp directory: a Unix socket under it (a DataLoader worker's) would "
            f"exceed {UNIX_PATH_MAX} bytes; make the suite's temp directory under a shorter one (scratch_parent)"
        )
    made = {name: root / sub for name, sub in SCRATCH_DIRS.items()}
    for directory in made.values():
        directory.mkdir(parents=True, exist_ok=True)
    return {
        SCRATCH_ENV: str(root),
        "PYTHONDONTWRITEBYTECODE": "1",
        **{name: str(path) for name, path in made.items()},
    }


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


def descendants(pid: int, proc_dir: Path = Path("/proc")) -> list[int]:
    """Every live descendant of ``pid``, read from ``/proc/<pid>/stat`` (Linux), parents before children.

    Needed because torchrun starts each worker in a session of its own (torch.distributed.elastic's
    SubprocessHandler: ``start_new_session=True``): killing torchrun's process group leaves the workers
    running and holding its output pipes, so reading that output never ends."""
    children: dict[int, list[int]] = {}
    for stat in proc_dir.glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone since the listing
            continue
        fields = text[text.rfind(")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        kids = children.get(todo.pop(0), [])
        found += kids
        todo += kids
    return found


def kill_tree(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL ``proc``'s process group and every descendant, by process id, in whatever session it is."""
    tree = descendants(proc.pid)
    runner.kill_group(proc)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def wait(proc: subprocess.Popen[Any], timeout: float) -> Result:
    """Wait up to ``timeout`` seconds, reading the output; past it kill the process and every descendant
    (torchrun's workers included) and report timed_out. Bounded even when something this cannot find
    still holds the output pipes: then the output read so far is returned."""
    started = time.monotonic()
    argv = tuple(str(a) for a in proc.args) if isinstance(proc.args, list | tuple) else (str(proc.args),)
    code: int | None = None
    try:
        try:
            out, err = proc.communicate(timeout=max(0.0, timeout))
            code = proc.returncode
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            out, err = _drain(proc)
    except BaseException:
        kill_tree(proc)
        raise
    finally:
        runner.kill_group(proc)  # stragglers of its group after it exited
    return Result(argv, code, out or "", err or "", time.monotonic() - started)


def _drain(proc: subprocess.Popen[Any]) -> tuple[str, str]:
    """The rest of a killed process's output, waiting at most :data:`KILL_MARGIN_S` for end-of-file."""
    try:
        return proc.communicate(timeout=KILL_MARGIN_S)
    except subprocess.TimeoutExpired as exc:  # an orphan (its parent died earlier) still holds the pipes
        return _text(exc.stdout), _text(exc.stderr)


def _text(data: bytes | str | None) -> str:
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else (data or "")


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
