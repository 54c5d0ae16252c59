"""Files that are either complete or absent: write to a temporary name in the same directory, then rename.

``os.replace`` within one directory is atomic on POSIX, so a reader (another build, ``pip install``, a CI
job collecting reports) sees the old file or the new one, never half of either, also when torchkiln is
interrupted half-way. Every document torchkiln writes (lock files, manifests, step state, verify reports)
and every wheel it publishes goes through here.

Standard library only: the verification suite uses it inside runtime images.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

# Temporaries carry this prefix, so a later run can find and remove those a SIGKILL left behind.
PARTIAL_MARK = ".torchkiln-partial-"


@contextmanager
def replacing(path: Path, *, mode: int | None = None) -> Iterator[BinaryIO]:
    """An open temporary file next to ``path``; renamed over ``path`` when the block succeeds, removed
    when it fails (or is interrupted). For writers that stream (a zip archive), not hold, what they write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{PARTIAL_MARK}{path.name}.", dir=path.parent)
    try:
        # mkstemp makes 0600; a document is for everyone who can read the directory (umask applies).
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, (0o666 if mode is None else mode) & ~umask)
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bytes(path: Path, data: bytes) -> None:
    with replacing(path) as handle:
        handle.write(data)


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, data: Any) -> None:
    """``data`` as indented JSON (keys in the order given) with a final newline."""
    write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def copy(source: Path, target: Path) -> Path:
    """Copy ``source`` to ``target`` (a copy, never a link: rewriting the source later must not reach the
    target). Raises FileNotFoundError for a missing source, leaving nothing behind."""
    with source.open("rb") as src, replacing(target) as handle:
        shutil.copyfileobj(src, handle, length=1 << 20)
    return target


def clean_partials(directory: Path) -> list[Path]:
    """Remove the temporaries a killed process left in ``directory``. Returns what was removed."""
    removed = []
    if directory.is_dir():
        for path in sorted(directory.iterdir()):
            if path.name.startswith(PARTIAL_MARK) and path.is_file():
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed
