"""What a checkout's commit tracks, and the files of git's own that decide what git says about the checkout.

Read for :mod:`torchkiln.build.treewatch`, which checks after every build step that neither changed.
:func:`tracked` lists every path the commit of a checkout tracks: the files and symbolic links of ``HEAD``'s
tree and of each checked-out submodule's ``HEAD``, recursively (paths from the top), each with the mode and
blob id git records for it; :func:`blob` is that pair for what a path holds now. :func:`git_dirs` finds the
checkouts' git directories (a ``.git`` directory, or the one a ``.git`` file names and its common directory),
and :func:`control` reads the files in them that decide what git reports about the tree: ``config`` (a
filter, ``core.worktree``, ``core.fsmonitor``, ``status.showUntrackedFiles``), ``HEAD``, ``refs/``,
``packed-refs``, ``shallow``, ``hooks/``, ``info/`` (``exclude``, ``attributes``, ``sparse-checkout``,
``grafts``), ``objects/info/`` (``alternates``) and every submodule's under ``modules/``, each by its sha256;
the object store's other files by their stat identity (an object is named by its content: a new one changes
nothing an existing name means, a rewritten one has a new inode or ctime). Left out: the index (git rewrites
it on a read such as ``git status``), the reflogs, lock files (``*.lock``: git's own, while it writes) and
``hooks/*.sample`` (git runs no hook by that name).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from torchkiln.errors import TorchkilnError

from .exact import GITLINK, blob_sha1, git_mode, head_entries

# What git would record for what a path holds: (mode, blob id); ("tree", "") for a directory.
Blob = tuple[str, str]

UNREAD = frozenset({"index", "logs"})  # in a git directory: rewritten by reads, or history only


def tracked(repo: Path) -> tuple[dict[str, Blob], list[str]]:
    """Every path the commit of the checkout ``repo`` tracks, and each checked-out submodule's commit
    (recursively, each at its own ``HEAD``, as ``git status`` compares it), by path from the top, with its
    mode and blob id; and the checkouts themselves ("" for the top, then each submodule's path)."""
    entries: dict[str, Blob] = {}
    repos: list[str] = []
    _tracked(repo, "", entries, repos)
    return entries, repos


def _tracked(top: Path, prefix: str, entries: dict[str, Blob], repos: list[str]) -> None:
    try:
        found = head_entries(top / prefix if prefix else top)
    except TorchkilnError:
        if not prefix:
            raise
        return  # a submodule with no commit checked out (git_differences names it)
    repos.append(prefix.rstrip("/"))
    for name, entry in found.items():
        if entry.mode != GITLINK:
            entries[prefix + name] = (entry.mode, entry.oid)
        elif os.path.lexists(top / prefix / name / ".git"):
            _tracked(top, f"{prefix}{name}/", entries, repos)


def blob(path: Path) -> Blob | None:
    """What git would record for what ``path`` holds now (its mode and blob id), None when absent."""
    mode = git_mode(path)
    if mode is None:
        return None
    if mode in ("tree", "special"):
        return (mode, "")
    return (mode, blob_sha1(path) or "")


def git_dirs(top: Path, repos: Iterable[str] = ("",)) -> list[Path]:
    """The git directories of the checkouts ``repos`` (paths under ``top``, "" the top itself): each
    ``.git`` directory, or the one a ``.git`` file names (``gitdir: ...``) and its ``commondir``. One that
    lies inside another (a submodule's under ``.git/modules``) is read with it."""
    found: set[Path] = set()
    for relative in repos:
        gitdir = _gitdir(top / relative / ".git" if relative else top / ".git")
        if gitdir is None:
            continue
        found.add(gitdir)
        common = gitdir / "commondir"
        if common.is_file():
            found.add((gitdir / common.read_text(errors="replace").strip()).resolve())
    out: list[Path] = []
    for directory in sorted(found, key=lambda p: (len(p.parts), str(p))):
        if not any(directory.is_relative_to(o) for o in out):
            out.append(directory)
    return out


def _gitdir(dot: Path) -> Path | None:
    try:
        st = os.lstat(dot)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return dot.resolve()
    if stat.S_ISREG(st.st_mode):
        text = dot.read_text(errors="replace").strip()
        if text.startswith("gitdir:"):
            return (dot.parent / text.removeprefix("gitdir:").strip()).resolve()
    return None


def control(top: Path, dirs: Iterable[Path]) -> dict[str, str]:
    """The files of the git directories ``dirs`` that decide what git says about the tree (see the
    module's docstring), each named from ``top`` when it lies inside (``.git/config``), with what it holds:
    ``sha256:...`` (a file), ``link:...`` (a symbolic link), ``stat:...`` (an object store file)."""
    out: dict[str, str] = {}
    for gitdir in dirs:
        _git_dir(gitdir, out, top)
    return out


def lasting(found: dict[str, str]) -> dict[str, str]:
    """:func:`control`'s answer without the object store's stat identities (which a copy of the same
    checkout changes): what a fetch records of the checkout it left."""
    return {k: v for k, v in found.items() if not v.startswith("stat:")}


def _label(path: Path, top: Path) -> str:
    return path.relative_to(top).as_posix() if path.is_relative_to(top) else str(path)


def _children(directory: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as entries:
            return sorted(entries, key=lambda e: e.name)
    except OSError:
        return []


def _git_dir(gitdir: Path, out: dict[str, str], top: Path) -> None:
    for entry in _children(gitdir):
        path = Path(entry.path)
        if entry.name in UNREAD or entry.name.endswith(".lock"):
            continue
        if entry.name == "objects" and entry.is_dir(follow_symlinks=False):
            _files(path, out, top, by_stat=True)
        elif entry.name in ("modules", "worktrees") and entry.is_dir(follow_symlinks=False):
            _nested(path, out, top)
        else:
            _files(path, out, top)


def _nested(directory: Path, out: dict[str, str], top: Path) -> None:
    """``modules/`` and ``worktrees/``: each submodule's or linked worktree's git directory (one holding
    ``HEAD``), at any depth of its name, read as a git directory (its index and reflogs left out)."""
    for entry in _children(directory):
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            if (path / "HEAD").is_file():
                _git_dir(path, out, top)
            else:
                _nested(path, out, top)
        else:
            _files(path, out, top)


def _files(path: Path, out: dict[str, str], top: Path, *, by_stat: bool = False) -> None:
    try:
        st = os.lstat(path)
    except OSError:
        return
    label = _label(path, top)
    if stat.S_ISDIR(st.st_mode):
        for entry in _children(path):
            sample = path.name == "hooks" and entry.name.endswith(".sample")  # never run by git
            if not entry.name.endswith(".lock") and not sample:
                info = path.name == "objects" and entry.name == "info"  # alternates: by content
                _files(Path(entry.path), out, top, by_stat=by_stat and not info)
    elif stat.S_ISLNK(st.st_mode):
        out[label] = f"link:{os.readlink(path)}"
    elif by_stat:
        out[label] = f"stat:{st.st_mode}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
    elif stat.S_ISREG(st.st_mode):
        try:
            out[label] = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            out[label] = "unreadable"
    else:
        out[label] = f"special:{stat.S_IFMT(st.st_mode)}"
