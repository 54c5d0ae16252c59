"""Files that are either complete or absent: write to a temporary name in the same directory, then rename.

``os.replace`` within one directory is atomic on POSIX, so a reader (another build, ``pip install``, a CI
job collecting reports) sees the old file or the new one, never half of either, also when torchkiln is
interrupted half-way. Every document torchkiln writes (lock files, manifests, step state, verify reports)
and every wheel it publishes goes through here.

Standard library only (with :mod:`torchkiln.errors`, which is too): the verification suite uses it inside
runtime images.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, BinaryIO

from torchkiln.errors import name_path
from torchkiln.process.supervisor import pid_alive

# Temporaries carry this prefix and the writer's pid, so a later run can find and remove those a SIGKILL
# left behind, and only those: the writer holds an exclusive flock on its temporary while it writes, so a
# second build sharing the directory (one dist/ for several recipes) never removes a first build's
# in-flight file.
PARTIAL_MARK = ".torchkiln-partial-"
# A temporary this young whose writer's pid is alive may be in the instant between its creation and its
# flock: left alone.
YOUNG_S = 60.0


@contextmanager
def replacing(path: Path, *, mode: int | None = None) -> Iterator[BinaryIO]:
    """An open temporary file next to ``path``; renamed over ``path`` when the block succeeds, removed
    when it fails (or is interrupted). For writers that stream (a zip archive), not hold, what they write.
    An OSError names ``path`` (a failed write() names no file), and removing the temporary after a failure
    never replaces the error that caused it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f"{PARTIAL_MARK}{os.getpid()}-{path.name}.", dir=path.parent)
    except OSError as exc:
        raise name_path(exc, path) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # ours while it is open: see clean_partials
            # mkstemp makes 0600; a document is for everyone who can read the directory (umask applies).
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, (0o666 if mode is None else mode) & ~umask)
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with suppress(OSError):
            Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            name_path(exc, path)
        raise


def write_bytes(path: Path, data: bytes) -> None:
    with replacing(path) as handle:
        handle.write(data)


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def keep_text(directory: Path, name: str, text: str) -> None:
    """``text`` as ``directory/name`` (the directory made as needed), renamed into place, without fsync: for
    records whose loss costs a recomputation, never a wrong answer (torchkiln.plan.records, the ELF readings
    of torchkiln.artifacts.elf), written by the dozen where a build must stay fast. Raises OSError with
    nothing of the write left behind; a directory it made stays only when the record was written."""
    made = not directory.exists()
    tmp: str | None = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, directory / name)
    except OSError:
        if tmp is not None:
            with suppress(OSError):
                os.unlink(tmp)
        if made:  # a full filesystem keeps no empty directory of ours either
            with suppress(OSError):
                directory.rmdir()
        raise


def write_json(path: Path, data: Any) -> None:
    """``data`` as indented JSON (keys in the order given) with a final newline."""
    write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def copy(source: Path, target: Path) -> Path:
    """Copy ``source`` to ``target`` (a copy, never a link: rewriting the source later must not reach the
    target). Raises FileNotFoundError for a missing source, leaving nothing behind."""
    with source.open("rb") as src, replacing(target) as handle:
        shutil.copyfileobj(src, handle, length=1 << 20)
    return target


def _abandoned(path: Path) -> bool:
    """Whether no live writer owns the temporary ``path``: nobody holds its flock, and its writer's pid (in
    its name) is gone, or the file is older than a writer takes to lock it (the pid was reused)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a live writer holds it
        fcntl.flock(fd, fcntl.LOCK_UN)
        pid_text = path.name[len(PARTIAL_MARK) :].partition("-")[0]
        if not pid_text.isdigit() or not pid_alive(int(pid_text)):
            return True
        return time.time() - os.fstat(fd).st_mtime > YOUNG_S
    finally:
        os.close(fd)


def clean_partials(directory: Path) -> list[Path]:
    """Remove the temporaries killed processes left in ``directory``, never one a live build is writing
    (a shared dist/). Returns what was removed."""
    removed = []
    if directory.is_dir():
        for path in sorted(directory.iterdir()):
            if path.name.startswith(PARTIAL_MARK) and path.is_file() and _abandoned(path):
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed
