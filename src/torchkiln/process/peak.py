"""Run a command and report the peak resident memory of the largest process of its tree, truthfully.

Run as a script (``python -I -S peak.py REPORT ARGV...``) by :func:`torchkiln.process.runner.stream` when a
caller asks for the peak. Why a separate process: Linux folds the memory a process had *before* ``exec``
into its ``ru_maxrss`` (``exec_mmap`` keeps the old image's high-water mark), and Python's subprocess starts
children with ``vfork``, whose "old image" is the spawner's own address space. So ``wait4`` on a direct
child of torchkiln reports at least torchkiln's own lifetime peak (a build or a test session that imported
torch: hundreds of MiB) whatever the child used. This script is small when it forks; its child's figure
includes at most this script's own few MiB, then whatever the command and the descendants it reaped (ninja's
compilers) reached.

It exits as the command did (a command killed by a signal kills this script with the same signal), and
writes the peak in bytes to REPORT.
"""

from __future__ import annotations

import os
import signal
import sys


def main(argv: list[str]) -> int:
    report, command = argv[0], argv[1:]
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            print(f"{command[0]}: {exc.strerror}", file=sys.stderr)
        os._exit(127)
    # the group's stop signals reach the command too (one process group): this script outlives it
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    _, status, usage = os.wait4(pid, 0)
    with open(report, "w", encoding="ascii") as out:
        out.write(str(usage.ru_maxrss * 1024))
    if os.WIFSIGNALED(status):
        killer = os.WTERMSIG(status)
        if killer != signal.SIGKILL:
            signal.signal(killer, signal.SIG_DFL)
        os.kill(os.getpid(), killer)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
