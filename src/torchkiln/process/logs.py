"""Per-step log files, kept per run, and what to show of them when a step fails.

Each run that runs a step writes its logs into a directory of its own (``<workdir>/logs/<UTC time>/``) and
points ``<workdir>/logs/latest`` at it: a rebuild never overwrites the log of the build before it.

A failed PyTorch build prints tens of thousands of lines; the cause is almost always the *first* compiler
error, far above the tail (ninja keeps going for the jobs already running). So a failure report is: the
first compiler error line, the last lines of the log, and the path of the full log.
"""

from __future__ import annotations

import os
import re
import shutil
from collections import deque
from pathlib import Path

# Most specific first; the first line (in log order) that matches any of them is the first error.
ERROR_PATTERNS = (
    re.compile(r"^\S.*?:\d+(:\d+)?:\s+(fatal )?error\b"),  # gcc/clang/nvcc: file:line:col: error: ...
    re.compile(r"^\S.*?\(\d+\): (catastrophic )?error\b"),  # nvcc/EDG front end: file(line): error ...
    re.compile(r"\bnvcc fatal\b"),
    re.compile(r"^CMake Error\b"),
    re.compile(r"undefined reference to\b"),
    re.compile(r"^collect2: error\b"),
    re.compile(r"^(c\+\+|g\+\+|gcc|cc|clang\+\+?): (fatal )?error\b"),
    re.compile(r"^\S+\.(c|cc|cpp|cu|h|hpp): .*error\b"),
)
FALLBACK_PATTERNS = (
    re.compile(r"^FAILED: "),
    re.compile(r"^(ERROR|error|fatal):"),  # pip, setuptools, git
    re.compile(r"^[A-Za-z_.]*(Error|Exception): "),  # a Python exception ending a traceback
    re.compile(r"Error \d+$"),
)


KEEP_RUNS = 20  # run directories kept under <workdir>/logs (the newest; ``latest`` links the last one)
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
    link.replace(logs / LATEST)  # atomic: the link is the old run's or this one's, never missing
    runs = sorted(p for p in logs.iterdir() if p.is_dir() and not p.is_symlink())
    for old in runs[:-KEEP_RUNS]:
        shutil.rmtree(old, ignore_errors=True)
    return run


def log_name(step_name: str) -> str:
    """``torch:fetch:fetch-ref`` -> ``torch-fetch-fetch-ref.log``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", step_name).strip("-") + ".log"


def first_error(lines: list[str] | Path) -> str | None:
    """The first compiler error in a log (a file or its lines), else the first generic failure line."""
    if isinstance(lines, Path):
        lines = lines.read_text(encoding="utf-8", errors="replace").splitlines()
    fallback = None
    for line in lines:
        text = line.rstrip("\n")
        if any(p.search(text) for p in ERROR_PATTERNS):
            return text
        if fallback is None and any(p.search(text) for p in FALLBACK_PATTERNS):
            fallback = text
    return fallback


def tail(path: Path, count: int = 30) -> list[str]:
    """The last ``count`` lines of a log file (read in one pass, memory bounded by ``count``)."""
    if not path.exists():
        return []
    with path.open(encoding="utf-8", errors="replace") as handle:
        return [line.rstrip("\n") for line in deque(handle, maxlen=count)]
