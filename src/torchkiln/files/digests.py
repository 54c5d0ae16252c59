"""sha256 of files, of source trees and of JSON-able data: the one way torchkiln hashes. Standard library
only (the noxfile's helper and the runtime image use it)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

# Build outputs inside a source tree: not part of what it is.
IGNORED_DIRS = frozenset({".git", "build", "dist", "__pycache__", ".eggs", ".torchkiln"})


# sha256 by (device, inode, size, mtime, ctime) in this process: a build reads the same wheels several times
# (a step's inputs, the next step's, the check's, publish), 0.2 to 2.5 GB each for torch. ctime changes with
# any write to the file and cannot be set back (os.utime sets it to now), so a file whose bytes changed is
# never answered from here, whatever its mtime says.
_KNOWN: dict[tuple[int, int, int, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks (once per file version in a process)."""
    with path.open("rb") as handle:
        st = os.fstat(handle.fileno())
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        known = _KNOWN.get(key)
        if known is not None:
            return known
        h = hashlib.sha256()
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            h.update(chunk)
    if len(_KNOWN) > 4096:
        _KNOWN.clear()
    _KNOWN[key] = found = h.hexdigest()
    return found


def digest(data: Any) -> str:
    """Hex sha256 of ``data`` as canonical JSON (sorted keys; anything else as its str)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def tree_files(path: Path, exclude: Collection[str] = ()) -> Iterator[tuple[str, Path]]:
    """(relative path, path) of every file of a source tree, sorted, build outputs left out: the
    directories in IGNORED_DIRS and the files named (relative) in ``exclude``, which the build itself
    writes into the tree (torchvision's version.py)."""
    excluded = frozenset(exclude)
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in IGNORED_DIRS and not d.endswith(".egg-info"))
        for name in sorted(files):
            full = Path(root) / name
            relative = str(full.relative_to(path))
            if relative not in excluded:
                yield relative, full


def tree_sha256(path: Path, exclude: Collection[str] = ()) -> str:
    """sha256 over every file's relative path and contents (build outputs and ``exclude`` left out): what a
    tree without a commit was, independent of timestamps. Reads the whole tree."""
    h = hashlib.sha256()
    for relative, full in tree_files(path, exclude):
        if full.is_symlink():
            h.update(f"{relative}\0link\0{os.readlink(full)}\n".encode())
            continue
        if not full.is_file():
            continue  # a socket or a FIFO: not a source file
        try:
            file_digest = file_sha256(full)
        except OSError:
            continue  # vanished while reading
        h.update(f"{relative}\0{file_digest}\n".encode())
    return h.hexdigest()
