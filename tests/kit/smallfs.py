"""Real small filesystems for the fault tests: a full disk is a full tmpfs (the ``mount`` fixture in
conftest.py makes one), never a mock."""

from __future__ import annotations

import errno
from pathlib import Path


def fill(directory: Path) -> Path:
    """Fill ``directory``'s filesystem up: the next write there is a real ENOSPC."""
    filler = directory / "filler"
    # unbuffered: a buffered file keeps what did not fit, and Python 3.14 tries it again on close (ENOSPC
    # out of the ``with``; 3.13 and older dropped it)
    with filler.open("wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler
