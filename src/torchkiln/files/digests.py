"""sha256 of files, of source trees and of JSON-able data: the one way torchkiln hashes. Standard library
only (the noxfile's helper and the runtime image use it)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

# Not part of a source tree wherever they are: git's own data. (Until issue 35 every "build", "dist",
# "__pycache__", ".eggs", ".torchkiln" and "*.egg-info" directory at any depth was left out too, so a file
# planted there, or upstream's own tools/build/ of PyTorch 2.6.0, was outside the digest; the build's own
# outputs are now left out by name, as the build recorded them: torchkiln.build.treeguard.)
IGNORED_DIRS = frozenset({".git"})


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


def tree_files(
    path: Path, exclude: Collection[str] = (), skip: Collection[Path] = ()
) -> Iterator[tuple[str, Path]]:
    """(relative path, path) of every entry of a source tree (files and symlinks, a symlink to a directory
    included and not followed), sorted, ``.git`` left out, and the entries named (relative) in ``exclude``:
    the build's own outputs. ``skip``: absolute directories that are not part of the tree even when inside it
    (the build's work directory and dist/)."""
    for relative, full in tree_entries(path, exclude, skip):
        yield relative, Path(full)


def tree_entries(
    path: Path, exclude: Collection[str] = (), skip: Collection[Path] = ()
) -> list[tuple[str, str]]:
    """:func:`tree_files`' entries with each path as a string: what a walk that only stats or lists them
    takes (a tree is walked several times a build, and a ``Path`` per entry was half of each walk)."""
    excluded = frozenset(exclude)
    top = path.resolve()
    skipped = set()
    for directory in skip:
        try:
            skipped.add(Path(directory).resolve().relative_to(top).as_posix())
        except ValueError:
            continue
    found: list[tuple[str, str]] = []
    start = len(os.path.join(path, ""))
    for root, dirs, files in os.walk(path):
        base = root[start:]  # relative to the top, "" at the top itself
        keep = []
        for d in sorted(dirs):
            relative = f"{base}/{d}" if base else d
            if d in IGNORED_DIRS or relative in skipped:
                continue
            full = os.path.join(root, d)
            if os.path.islink(full):
                found.append((relative, full))
            else:
                keep.append(d)
        dirs[:] = keep
        found += [(f"{base}/{n}" if base else n, os.path.join(root, n)) for n in files]
    found.sort()
    return [entry for entry in found if entry[0] not in excluded]


def tree_sha256(path: Path, exclude: Collection[str] = (), skip: Collection[Path] = ()) -> str:
    """sha256 over every entry's relative path, git-style mode (100644, 100755, 120000) and contents (a
    symlink: its target), ``.git``, ``exclude`` (the build's own outputs) and ``skip`` left out: what a tree
    without a commit was, independent of timestamps. Reads the whole tree."""
    h = hashlib.sha256()
    for relative, full in tree_files(path, exclude, skip):
        if full.is_symlink():
            h.update(f"{relative}\0120000\0{os.readlink(full)}\n".encode("utf-8", "surrogateescape"))
            continue
        if not full.is_file():
            continue  # a socket or a FIFO: not a source file
        try:
            file_digest = file_sha256(full)
            mode = "100755" if full.stat().st_mode & 0o100 else "100644"
        except OSError:
            continue  # vanished while reading
        h.update(f"{relative}\0{mode}\0{file_digest}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()
