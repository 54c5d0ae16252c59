"""One maker at a time for what the tests keep between runs (the test cache, the images report).

The integration tests run in two processes at once (pytest-xdist's workers, ``nox -s tests``), and a user may
run two sessions: each thing made once and kept (a downloaded wheel, a venv, a toolkit, a debootstrapped root)
is made under :func:`exclusive`, which holds an advisory lock (``flock``) on a lock file beside it. The second
process waits, then finds the thing made and uses it; nothing is removed under a process that reads it."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def exclusive(target: Path) -> Iterator[None]:
    """Hold the lock of ``target`` (``.<name>.lock`` in its directory, made if missing) until the block ends."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
