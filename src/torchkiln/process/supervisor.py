"""The watchdog that a SIGKILL of torchkiln cannot orphan: nothing a build started outlives it.

SIGKILL cannot be caught, so torchkiln cannot clean up after it; a process that outlives torchkiln must do
it. :func:`torchkiln.process.runner.supervised` starts this module as a small process in its own session, holding
the read end of a pipe whose only write end is torchkiln's. Every process torchkiln starts meanwhile
(:func:`torchkiln.process.runner.spawn`) carries ``TORCHKILN_RUN=<id>`` in its environment, which its children
inherit: ninja, the compilers, pip, the sccache server (which leaves its process group and session when it
daemonizes, so killing process groups alone would miss it). When the pipe closes (torchkiln exited, however
it died), the watchdog SIGKILLs every process whose environment carries the id until none is left, then
removes the files and directories torchkiln asked it to (the sccache server's socket, a sandbox's private
/tmp: its processes are gone by then, and with them the sandbox's mounts). A normal end closes the pipe too:
what a build left running is stopped then as well. Process ids are never remembered (a pid or group id is
reused once its process is gone); the environment mark names this run's processes only.

Why not a parent-death signal (``PR_SET_PDEATHSIG``): it reaches only the direct child, not ninja's
compilers or a daemonized server. Why not a subreaper: the compilers are not the watchdog's descendants.

Standard library only; Linux (``/proc``). Protocol on stdin, one line each: ``file <path>``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path

MARK = "TORCHKILN_RUN"
SETTLE_S = 10.0


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (of any user). Files named after their writer's pid (partial files,
    sccache sockets) are leftovers once it does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def marked(run_id: str, *, skip: int) -> list[int]:
    """Pids of the processes whose environment carries ``TORCHKILN_RUN=run_id`` (other than ``skip``)."""
    needle = f"{MARK}={run_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == skip:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone meanwhile, or another user's
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def sweep(run_id: str, files: list[str]) -> int:
    """SIGKILL the run's processes until none is left (or SETTLE_S passed); remove ``files``.
    Returns how many processes were killed."""
    killed: set[int] = set()
    deadline = time.monotonic() + SETTLE_S
    while True:
        pids = marked(run_id, skip=os.getpid())
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        if not pids or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for name in files:
        if os.path.isdir(name) and not os.path.islink(name):  # a sandbox's private /tmp, a socket's directory
            shutil.rmtree(name, ignore_errors=True)
            continue
        with contextlib.suppress(OSError):
            os.unlink(name)
    return len(killed)


def main(argv: list[str]) -> int:
    run_id = argv[0]
    files: list[str] = []
    # Ctrl-C in torchkiln's terminal goes to its process group, not to this session; ignore it anyway.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for line in sys.stdin:
        word, _, value = line.rstrip("\n").partition(" ")
        if word == "file" and value:
            files.append(value)
    sweep(run_id, files)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
