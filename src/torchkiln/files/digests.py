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


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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
