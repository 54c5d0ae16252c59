"""Per-step log files, kept per run, and what to show of them when a step fails.

Each run that runs a step writes its logs into a directory of its own (``<workdir>/logs/<UTC time>/``) and
points ``<workdir>/logs/latest`` at it: a rebuild never overwrites the log of the build before it.

A failed PyTorch build prints tens of thousands of lines; the cause is almost always the *first* compiler
error, far above the tail (ninja keeps going for the jobs already running). So a failure report is: the
first compiler or tool error line (:func:`first_error`: a cause outranks a generic failure line, which
outranks git's noise), the last lines of the log, and the path of the full log.
"""

from __future__ import annotations

import os
import re
import shutil
from collections import deque
from pathlib import Path

# What a failed step's log says first, by rank: the first rank with a matching line wins, and within a rank
# the first line in log order. A compiler's or a tool's own error names the cause; a generic failure line
# (ninja's ``FAILED:`` edge, pip's ``error:``, a Python exception) only says that something failed; git's
# complaints about a tree that is no git checkout are noise (setup.py files ask git for a version and carry
# on without one) and are shown only when nothing else failed.
CAUSE_PATTERNS = (
    re.compile(r"^\S.*?:\d+(:\d+)?:\s+(fatal )?error\b"),  # gcc/clang/nvcc: file:line:col: error: ...
    re.compile(r"^\S.*?\(\d+\): (catastrophic )?error\b"),  # nvcc/EDG front end: file(line): error ...
    re.compile(r"\bnvcc fatal\b"),
    re.compile(r"^CMake Error\b"),
    re.compile(r"undefined reference to\b"),
    re.compile(r"^collect2: error\b"),
    re.compile(r"^(c\+\+|g\+\+|gcc|cc|clang\+\+?): (fatal )?error\b"),
    re.compile(r"^\S+\.(c|cc|cpp|cu|h|hpp): .*error\b"),
    # The compiler cache's own failure, which ninja's FAILED line of the same command only points at:
    # ccache 4.x ``ccache: error: Could not find compiler "c++" in PATH``, ``ccache: error: CCACHE_MAXSIZE:
    # invalid size``; sccache's src/main.rs ``sccache: error: {}`` (and ``sccache: encountered fatal error``).
    re.compile(r"^s?ccache: (error|encountered fatal error)\b"),
    re.compile(r"^ninja: (error|fatal):"),  # ninja itself (a missing build.ninja, a bad rule)
    re.compile(r"^/bin/sh: \d+: .+: not found$"),  # a tool a build command names is not installed
    # PyTorch's setup.py check_submodules() (v2.6.0 setup.py, lines 399-440): a tree without submodules.
    re.compile(r"^\s*--- Submodule initi?alization failed"),
    re.compile(r"^Could not find any of .+ in \S"),
    # A full disk or quota (strerror of ENOSPC / EDQUOT, as every tool prints it): whatever failed after it
    # (a compiler, pip, git, ninja's FAILED line) failed because of it.
    re.compile(r"No space left on device|Disk quota exceeded"),
)
FAILURE_PATTERNS = (
    re.compile(r"^FAILED: "),
    re.compile(r"^(ERROR|error|fatal):"),  # pip, setuptools, git
    re.compile(r"^[A-Za-z_.]*(Error|Exception): "),  # a Python exception ending a traceback
    re.compile(r"Error \d+$"),
)
# git run by a build script outside a checkout (a source archive): torchvision's setup.py ``git rev-parse
# HEAD``, PyTorch's ``git submodule update``; it prints this and the script goes on (or fails later, for
# another reason, named by a line of a higher rank).
NOISE_PATTERNS = (re.compile(r"^fatal: not a git repository\b"),)
RANKS = (CAUSE_PATTERNS, FAILURE_PATTERNS, NOISE_PATTERNS)


KEEP_RUNS = 20  # run directories kept under <workdir>/logs (the newest; ``latest`` links the last one)
RUN_NAME = re.compile(r"\d{8}T\d{6}Z(-\d+)?")  # a run directory's name: its UTC start, then -2, -3, ...
LATEST = "latest"


def start_run_logs(logs: Path, stamp: str) -> Path:
    """A directory for this run's step logs (``<logs>/<stamp>``) with ``<logs>/latest`` pointing at it, so
    a rerun never overwrites the logs of an earlier one (the cold build's log survives its rebuilds); only
    the :data:`KEEP_RUNS` newest runs are kept."""
    run = logs / stamp
    suffix = 1
    while run.exists():
        suffix += 1
        run = logs / f"{stamp}-{suffix}"
    run.mkdir(parents=True)
    link = logs / f".{LATEST}.{os.getpid()}"
    link.unlink(missing_ok=True)
    link.symlink_to(run.name)
    latest = logs / LATEST
    if latest.is_dir() and not latest.is_symlink():  # not torchkiln's link: a rename cannot replace it
        shutil.rmtree(latest)
    link.replace(latest)  # atomic: the link is the old run's or this one's, never missing
    # only the run directories torchkiln made (<stamp>[-N]); anything else in logs/ is left alone
    runs = sorted(
        p for p in logs.iterdir() if p.is_dir() and not p.is_symlink() and RUN_NAME.fullmatch(p.name)
    )
    for old in runs[:-KEEP_RUNS]:
        shutil.rmtree(old, ignore_errors=True)
    return run


def log_name(step_name: str) -> str:
    """``torch:fetch:fetch-ref`` -> ``torch-fetch-fetch-ref.log``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", step_name).strip("-") + ".log"


def first_error(lines: list[str] | Path) -> str | None:
    """The line of a log that names why it failed (a file or its lines): the first compiler or tool error
    (the compiler cache's own included), else the first generic failure line, else git's noise; None when
    nothing in the log looks like a failure."""
    if isinstance(lines, Path):
        lines = lines.read_text(encoding="utf-8", errors="replace").splitlines()
    found: list[str | None] = [None] * len(RANKS)
    for line in lines:
        text = line.rstrip("\n")
        rank = _rank(text)
        if rank == 0:
            return text
        if rank is not None and found[rank] is None:
            found[rank] = text
    return next((text for text in found if text is not None), None)


def _rank(text: str) -> int | None:
    """The rank of a log line (an index of RANKS), None for an ordinary line. Noise is recognised first:
    git's ``fatal: not a git repository`` would otherwise be a generic failure (``fatal:``)."""
    if any(p.search(text) for p in NOISE_PATTERNS):
        return RANKS.index(NOISE_PATTERNS)
    for rank, patterns in enumerate(RANKS):
        if any(p.search(text) for p in patterns):
            return rank
    return None


def tail(path: Path, count: int = 30) -> list[str]:
    """The last ``count`` lines of a log file (read in one pass, memory bounded by ``count``)."""
    if not path.exists():
        return []
    with path.open(encoding="utf-8", errors="replace") as handle:
        return [line.rstrip("\n") for line in deque(handle, maxlen=count)]
