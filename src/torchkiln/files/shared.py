"""Identical files made one: hard links to one copy per content, kept in a directory of objects by sha256.

The environment store keeps venvs that hold the same large files again and again: each Python's build venv
and check venv of a several-Python build install the same NVIDIA libraries (py3-none wheels, 3 to 4 GB for
CUDA 12 and 13), and a torchvision build's build venv and check venv the same torch (5.3 GiB for
torch 2.6.0+cu124 with its NVIDIA wheels, measured with du). pip installs each as new files, so without this
a store of a few builds is tens of gigabytes of copies.

:func:`share_identical` links every large regular file of a tree to the object of its content
(``<objects>/<sha256[:2]>/<sha256>``), making the object from the first file that has that content. A file is
only ever *replaced* by a link (a new name renamed over the old: the content at that path is the same before
and after, and no inode is written to), so it is as safe as the store's own links: pip removes a file before
it writes one (it may be a hard link), and nothing runs from the store. Files whose mode or owner differ from
the object's keep their own copy (a link shares them), and ``.py`` files are left alone (their mtime is what
a ``.pyc`` is checked against; a link takes the object's).

An object whose only link is its own (every tree that used it removed) is garbage: :func:`sweep` removes
those. A builder racing another's sweep loses nothing: linking to an object that has just gone fails, and the
file keeps its own copy.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from torchkiln.files.digests import file_sha256

# Below this, the link saves less than the hashing costs (venvs hold tens of thousands of small files).
MIN_BYTES = 1 << 20


@dataclass(frozen=True)
class Shared:
    """What :func:`share_identical` did: files now linked to an object another file made, and their bytes."""

    files: int = 0
    bytes: int = 0


def _object(objects: Path, path: Path) -> Path:
    sha = file_sha256(path)
    return objects / sha[:2] / sha


def _link_over(source: Path, target: Path) -> bool:
    """``target`` becomes a hard link to ``source`` by a rename (never a moment without ``target``); False
    when ``source`` is gone (swept) or the link is refused."""
    temporary = target.with_name(f".{target.name}.{os.getpid()}.link")
    try:
        os.link(source, temporary)
    except OSError:
        return False
    try:
        os.replace(temporary, target)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        return False
    return True


def _same_kind(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_size, a.st_mode, a.st_uid, a.st_gid) == (b.st_size, b.st_mode, b.st_uid, b.st_gid)


def share_identical(
    tree: Path, objects: Path, *, also: Path | None = None, min_bytes: int = MIN_BYTES
) -> Shared:
    """Link each regular file of ``tree`` of ``min_bytes`` or more to the object of its content under
    ``objects`` (on ``tree``'s filesystem). ``also``: a tree whose files at the same relative paths are hard
    links to ``tree``'s (the venv ``tree`` was cloned from): each is linked to the object too, or the space
    would stay taken there. Returns what was shared with files that were there before."""
    files = saved = 0
    known = _object_inodes(objects)
    for text in large_files(tree, min_bytes):
        try:
            st = os.lstat(text)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_size < min_bytes or (st.st_dev, st.st_ino) in known:
            continue  # changed since it was listed; or a link to an object already (a clone of an entry)
        path = Path(text)
        twin = Path(also, path.relative_to(tree)) if also is not None else None
        if _share(path, st, objects, twin):
            files, saved = files + 1, saved + st.st_size
    return Shared(files, saved)


def _share(path: Path, st: os.stat_result, objects: Path, twin: Path | None) -> bool:
    """``path`` (``st``) made the object of its content, or linked to it (True: to an object that was there
    before); ``twin``, when it is a link to ``path``, too."""
    target = _object(objects, path)
    try:
        found = os.stat(target)
    except FileNotFoundError:
        found = None
    if found is not None and found.st_ino == st.st_ino and found.st_dev == st.st_dev:
        return False  # already the object
    if found is None:
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
            return False  # this file is the object now
        except FileExistsError:  # another builder made it first
            found = os.stat(target)
        except OSError as exc:
            if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                return False
            raise
    if not _same_kind(found, st) or not _link_over(target, path):
        return False
    if twin is not None:
        with contextlib.suppress(FileNotFoundError):
            tw = os.lstat(twin)
            if (tw.st_ino, tw.st_dev) == (st.st_ino, st.st_dev):
                _link_over(target, twin)
    return True


def large_files(tree: Path, min_bytes: int) -> list[str]:
    """The regular files of ``tree`` of ``min_bytes`` or more, but ``.py`` files (their mtime is what a
    ``.pyc`` is checked against; a link takes the object's), as paths under ``tree`` (symlinks are not
    followed). Listed by ``find`` where there is one: in C and outside the GIL, where a walk in Python held it
    for a venv's tens of thousands of entries (0.14 s against 0.07 s for a torch check venv's 23,000 on two
    cores) beside the post-build check's other threads (issue 47); by :func:`os.walk` where ``find`` is
    missing or fails."""
    # a trailing slash: a tree that is itself a symlink is listed, as os.walk lists it
    top = os.path.join(str(tree), "")
    find = shutil.which("find")
    if find is not None:
        size = ["-size", f"+{min_bytes - 1}c"] if min_bytes > 0 else []
        argv = [find, top, "-type", "f", *size, "!", "-name", "*.py", "-print0"]
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, check=False)
        if done.returncode == 0:
            return [os.fsdecode(p) for p in done.stdout.split(b"\0") if p]
    found = []
    for directory, _dirs, names in os.walk(top):
        for name in names:
            # strings until a file is large enough to matter: a Path for each of a venv's tens of thousands
            # of small files cost a clone's keep half a second (issue 38)
            text = os.path.join(directory, name)
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(text)
                if stat.S_ISREG(st.st_mode) and st.st_size >= min_bytes and not name.endswith(".py"):
                    found.append(text)
    return found


def _object_inodes(objects: Path) -> set[tuple[int, int]]:
    """The (device, inode) of every object: a file that is one of them needs no hashing to know it."""
    found: set[tuple[int, int]] = set()
    for directory, _dirs, names in os.walk(objects):
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(os.path.join(directory, name))
                found.add((st.st_dev, st.st_ino))
    return found


def sweep(objects: Path) -> int:
    """Remove the objects no tree links to any more (a link count of one: the object's own). Returns how
    many."""
    removed = 0
    if not objects.is_dir():
        return 0
    for directory, _dirs, names in os.walk(objects):
        for name in names:
            path = Path(directory, name)
            with contextlib.suppress(FileNotFoundError):
                if os.lstat(path).st_nlink == 1:
                    path.unlink()
                    removed += 1
    return removed
