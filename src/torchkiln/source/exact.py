"""Whether a source tree is exactly its commit's tree, and every way it is not.

A wheel built from a fetched ref must be built from that commit's tree and nothing else: a file git does not
track (an untracked or a ``.gitignore``'d one: a prebuilt ``.so``, a generated ``version.py``) is built into
the wheel as surely as a tracked one. So the difference between a checkout and its ``HEAD`` is read in full,
as :class:`Difference` entries, each one of three kinds:

==========  ===================================================================================================
extra       a path the commit does not have: untracked, ignored, inside a repository nested in the tree, a
            file where the commit has a directory (the commit's file is then ``removed``), a file inside a
            submodule that is not checked out
modified    content, mode (the executable bit) or type (file, symlink, submodule) differs from the commit; a
            submodule checked out at another commit than the one the commit records
removed     a path of the commit that is absent (a deleted file, a submodule not checked out)
==========  ===================================================================================================

Submodules are read the same way, recursively, each against the commit its superproject records (paths are
given from the top of the tree). Every git call runs with the settings that make ``git status`` look at the
files themselves, whatever the user's or the repository's configuration says (:data:`TRUTHFUL`): no
filesystem monitor, no untracked cache, stat data compared in full (ctime included, which no unprivileged
writer can set back), file modes and symlinks as they are, case as it is, replace objects ignored; paths that
the index marks ``assume-unchanged`` or ``skip-worktree`` (which ``git status`` does not look at) are compared
with the commit here, by their blob hash. A tree that is no git checkout has no commit: :func:`tree_files`
lists its files for the digest the lock file records instead.

What the build itself writes into a tree (its own outputs) is told apart by the build
(:mod:`torchkiln.build.treeguard`), from the :func:`entry_stat` of each path when it wrote it.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from torchkiln.artifacts.lockfile import TreeChange, TreeLink
from torchkiln.errors import TorchkilnError, few
from torchkiln.files.digests import file_sha256, tree_entries
from torchkiln.process import runner

KINDS = ("extra", "modified", "removed")

# `git -c` settings under which `git status` reports what the files are, not what a cache or the
# configuration says they are (git-config(1): core.fsmonitor, core.untrackedCache, core.ignoreStat,
# core.trustctime, core.checkStat, core.fileMode, core.symlinks, core.ignoreCase).
TRUTHFUL = (
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "core.ignoreStat=false",
    "core.trustctime=true",
    "core.checkStat=default",
    "core.fileMode=true",
    "core.symlinks=true",
    "core.ignoreCase=false",
    "status.showUntrackedFiles=all",
    "submodule.recurse=false",
)

GITLINK = "160000"
SYMLINK = "120000"

# (st_mode, st_size, st_mtime_ns, st_ctime_ns, st_ino) of a path (lstat), None when absent: what the build
# records of each file it wrote. ctime is set by the kernel on every change and cannot be set back by an
# unprivileged writer, so a file replaced or edited after the build wrote it no longer matches.
Stat = tuple[int, int, int, int, int] | None


@dataclass(frozen=True)
class Difference:
    """One way a tree differs from its commit: ``path`` (from the top of the tree, ``/``-separated), ``kind``
    (one of :data:`KINDS`) and ``detail`` (what git or the walk found: ``untracked``, ``ignored``,
    ``content``, ``mode 100644 -> 100755``, ``type symlink -> file``, ``submodule at <sha>``, ...)."""

    path: str
    kind: str
    detail: str


def entry_stat(path: str | Path) -> Stat:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def entry_sha256(path: Path) -> str | None:
    """sha256 of what a path holds as the build read it: a file's bytes, a symlink's target (as git stores
    it); None for a directory or an absent path."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return hashlib.sha256(os.fsencode(os.readlink(path))).hexdigest()
    if stat.S_ISREG(st.st_mode):
        try:
            return file_sha256(path)
        except OSError:
            return None
    return None


def git_mode(path: Path) -> str | None:
    """The mode git would record for what is at ``path`` now (100644, 100755, 120000; ``tree`` for a
    directory), None when absent. git keeps only the owner's executable bit."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return SYMLINK
    if stat.S_ISDIR(st.st_mode):
        return "tree"
    if stat.S_ISREG(st.st_mode):
        return "100755" if st.st_mode & stat.S_IXUSR else "100644"
    return "special"


def _git_environ() -> dict[str, str]:
    """This process's environment without git's own variables (``GIT_DIR``, ``GIT_INDEX_FILE``,
    ``GIT_WORK_TREE`` ... would point git at another repository or index), replace objects ignored."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["GIT_NO_REPLACE_OBJECTS"] = "1"
    return env


def run_git(
    repo: Path,
    args: Sequence[str],
    *,
    needed_for: str,
    config: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    errors: str = "replace",
) -> str:
    """stdout of ``git -C repo [-c config]... args...``; a failure raises TorchkilnError with git's own last
    line, and a missing git says what it was ``needed_for``."""
    settings = [arg for setting in config for arg in ("-c", setting)]
    try:
        done = runner.run(["git", "-C", str(repo), *settings, *args], env=env, errors=errors)
    except runner.ProcessError:
        raise TorchkilnError(f"git is not installed (needed {needed_for})") from None
    if not done.ok:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise TorchkilnError(
            f"git {' '.join(args)} in {repo} failed: {lines[-1] if lines else done.returncode}"
        )
    return done.stdout


def _git(repo: Path, *args: str) -> str:
    return run_git(
        repo,
        args,
        needed_for="to compare a checkout with its commit",
        config=TRUTHFUL,
        env=_git_environ(),
        errors="surrogateescape",
    )


def blob_sha1(path: Path) -> str | None:
    """The object id git would give what is at ``path`` (a blob: a file's bytes or a symlink's target)."""
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            data = os.fsencode(os.readlink(path))
        elif stat.S_ISREG(st.st_mode):
            data = path.read_bytes()
        else:
            return None
    except OSError:
        return None
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class Entry:
    """One entry of a commit's tree: git's mode (100644, 100755, 120000; 160000 a submodule) and object id."""

    mode: str
    oid: str


def head_entries(repo: Path, paths: Collection[str] | None = None) -> dict[str, Entry]:
    """The commit's entries (every file, symlink and gitlink of ``HEAD``'s tree, recursively; or only
    ``paths``), by path."""
    args = ["ls-tree", "-r", "-z", "--full-tree", "HEAD"]
    if paths is not None:
        if not paths:
            return {}
        args += ["--", *paths]
    out: dict[str, Entry] = {}
    for record in _git(repo, *args).split("\0"):
        if not record:
            continue
        meta, _, name = record.partition("\t")
        mode, _kind, oid = meta.split(" ")
        out[name] = Entry(mode, oid)
    return out


def _compare(repo: Path, name: str, entry: Entry | None) -> Difference | None:
    """What is at ``name`` now against the commit's ``entry`` (None: the commit has no such path)."""
    now = git_mode(repo / name)
    if entry is None:
        return None if now in (None, "tree") else Difference(name, "extra", "untracked")
    if entry.mode == GITLINK:
        return None  # submodules: :func:`_submodule`
    if now is None:
        return Difference(name, "removed", "deleted")
    if now != entry.mode:
        if now in ("100644", "100755") and entry.mode in ("100644", "100755"):
            return Difference(name, "modified", f"mode {entry.mode} -> {now}")
        return Difference(name, "modified", f"type {_type(entry.mode)} -> {_type(now)}")
    if blob_sha1(repo / name) != entry.oid:
        return Difference(name, "modified", "content")
    return None


def _type(mode: str) -> str:
    return {SYMLINK: "symlink", GITLINK: "submodule", "tree": "directory"}.get(
        mode, "file" if mode.startswith("100") else mode
    )


def _status_paths(repo: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """What ``git status`` lists (rename detection off, every untracked and ignored file one by one, the
    submodules left to :func:`_submodule`): the paths of tracked entries that differ, and the untracked or
    ignored paths with their detail (a directory, ending in ``/``, is a repository nested in the tree)."""
    out = _git(
        repo,
        "status",
        "--porcelain=v2",
        "-z",
        "--untracked-files=all",
        "--ignored=traditional",
        "--no-renames",
        "--ignore-submodules=all",
    )
    tracked: list[str] = []
    other: list[tuple[str, str]] = []
    for record in out.split("\0"):
        if not record:
            continue
        tag = record[0]
        if tag in "?!":
            other.append((record[2:], "untracked" if tag == "?" else "ignored"))
        elif tag == "1":  # 1 XY sub mH mI mW hH hI path
            tracked.append(record.split(" ", 8)[8])
        elif tag == "u":  # u XY sub m1 m2 m3 mW h1 h2 h3 path
            tracked.append(record.split(" ", 10)[10])
    return tracked, other


def _flagged(repo: Path) -> list[str]:
    """Index entries ``git status`` does not look at: ``assume-unchanged`` (a lowercase tag in ``git ls-files
    -v``) and ``skip-worktree`` (``S``)."""
    out = _git(repo, "ls-files", "-v", "-z")
    return [r[2:] for r in out.split("\0") if r and (r[0].islower() or r[0] == "S")]


def _walk(top: Path, relative: str) -> Iterator[str]:
    """Every entry below ``top / relative`` (a directory git lists as a whole: a repository nested in the
    tree), as paths from ``top``; its ``.git`` is git's data, not the tree's, as at the top."""
    for root, dirs, files in os.walk(top / relative):
        links = [d for d in dirs if os.path.islink(os.path.join(root, d))]
        dirs[:] = sorted(d for d in dirs if d != ".git" and d not in links)
        for name in sorted(files + links):
            yield os.path.relpath(os.path.join(root, name), top)


def git_differences(repo: Path, *, skip: Collection[Path] = ()) -> list[Difference]:
    """Every way the checkout ``repo`` differs from its ``HEAD``, submodules included, sorted by path.
    Paths under ``skip`` (absolute: the build's work directory or dist/ where they lie inside the tree) are
    left out."""
    prefixes = [_relative(Path(p).resolve(), repo.resolve()) for p in skip]
    wanted = tuple(p for p in prefixes if p is not None)
    found = _differences(repo.resolve(), "", wanted)
    return sorted((d for d in found if not _under(d.path, wanted)), key=lambda d: d.path)


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in prefixes)


def _relative(path: Path, top: Path) -> str | None:
    try:
        return path.relative_to(top).as_posix()
    except ValueError:
        return None


def _differences(repo: Path, prefix: str, skip: tuple[str, ...] = ()) -> list[Difference]:
    tracked, other = _status_paths(repo)
    other = [(name, detail) for name, detail in other if not _under(prefix + name.rstrip("/"), skip)]
    head = head_entries(repo)
    found: dict[str, Difference] = {}
    for name in sorted(set(tracked) | set(_flagged(repo))):
        difference = _compare(repo, name, head.get(name))
        if difference is not None:
            found[name] = difference
    for name, detail in other:
        if name.endswith("/"):  # a repository nested in the tree: all of its files are extra
            for inner in _walk(repo, name.rstrip("/")):
                found.setdefault(
                    inner, Difference(inner, "extra", f"{detail}, in a repository nested at {name}")
                )
        elif name in head:  # the commit has it, the index lost it (git rm --cached): as the commit says?
            difference = _compare(repo, name, head[name])
            if difference is not None:
                found.setdefault(name, difference)
        else:
            found.setdefault(name, Difference(name, "extra", detail))
    for name, entry in head.items():
        if entry.mode == GITLINK:
            for difference in _submodule(repo, name, entry.oid):
                found.setdefault(difference.path, difference)
    return [Difference(prefix + d.path, d.kind, d.detail) for d in found.values()]


def _submodule(repo: Path, name: str, recorded: str) -> list[Difference]:
    """The submodule at ``name`` against the commit ``recorded`` for it: absent or not checked out (removed,
    with any files there extra), at another commit (modified), and its own differences, recursively."""
    where = repo / name
    mode = git_mode(where)
    if mode is None:
        return [Difference(name, "removed", f"submodule (commit {recorded}) absent")]
    if mode != "tree":
        return [Difference(name, "modified", f"type submodule -> {_type(mode)}")]
    if not os.path.lexists(where / ".git"):
        extras = [Difference(p, "extra", "in a submodule that is not checked out") for p in _walk(repo, name)]
        return [Difference(name, "removed", f"submodule (commit {recorded}) not checked out"), *extras]
    at = _git(where, "rev-parse", "--verify", "--quiet", "HEAD^{commit}").strip()
    found = []
    if at != recorded:
        found.append(
            Difference(name, "modified", f"submodule at {at or 'no commit'}, the commit records {recorded}")
        )
    found += [Difference(f"{name}/{d.path}", d.kind, d.detail) for d in _differences(where, "")]
    return found


def changes(tree: Path, differences: Iterable[Difference]) -> list[TreeChange]:
    """The record of each difference: its kind, detail and what the build read there: a file's sha256, a
    symbolic link's own text (never the bytes of what it points to)."""
    out = []
    for d in differences:
        link = None if d.kind == "removed" else link_text(tree / d.path)
        digest = None if d.kind == "removed" or link is not None else entry_sha256(tree / d.path)
        out.append(TreeChange(d.path, d.kind, digest, d.detail, link))
    return out


# --------------------------------------------------------------------------------------------------
# Symbolic links that lead out of a tree: what is built through them is in no record of the tree.
# --------------------------------------------------------------------------------------------------


def link_text(path: Path) -> str | None:
    """A symbolic link's own text (``readlink``), None for anything else."""
    try:
        return os.readlink(path)
    except OSError:
        return None


def leaves(top: Path, relative: str) -> bool:
    """Whether the symbolic link ``relative`` of the tree ``top`` leads out of it: what it resolves to (its
    chain of links followed to the end, as the kernel does; a dangling one as far as it goes) lies outside
    the tree's own real path."""
    real_top = os.path.realpath(top)
    resolved = os.path.realpath(top / relative)
    return not (resolved == real_top or resolved.startswith(real_top.rstrip("/") + "/"))


def tracked_links(repo: Path) -> list[str]:
    """The symbolic links a checkout's index holds (mode 120000), its submodules' included, as paths from
    the top: links the commit itself has, which ``git status`` never lists."""
    out = _git(repo, "ls-files", "--stage", "-z", "--recurse-submodules")
    return [r.split("\t", 1)[1] for r in out.split("\0") if r.startswith(SYMLINK + " ")]


def outside_links(top: Path, paths: Iterable[str]) -> list[TreeLink]:
    """Of the tree's entries ``paths``, the symbolic links that lead out of it, each with its text, sorted."""
    found = {}
    for relative in paths:
        text = link_text(top / relative)
        if text is not None and leaves(top, relative):
            found[relative] = TreeLink(relative, text)
    return [found[p] for p in sorted(found)]


def describe(differences: Sequence[Difference]) -> str:
    """``N path(s) differ from the commit: extra a (untracked), modified b (mode 100644 -> 100755), ...``."""
    shown = few([f"{d.kind} {d.path} ({d.detail})" for d in differences])
    return f"{len(differences)} path(s) differ from the commit: {shown}"


# --------------------------------------------------------------------------------------------------
# A tree that is no git checkout: its files, for the digest that stands in for a commit.
# --------------------------------------------------------------------------------------------------


def tree_paths(top: Path, *, skip: Collection[Path] = ()) -> list[str]:
    """Every entry of a tree that is no git checkout that its digest covers (files and symlinks; ``.git`` and
    ``skip`` left out; :func:`torchkiln.files.digests.tree_files`), sorted."""
    return [relative for relative, _ in tree_entries(top, skip=skip)]


def stats(top: Path, paths: Collection[str]) -> dict[str, Stat]:
    return {p: entry_stat(os.path.join(top, p)) for p in paths}


def digests(top: Path, paths: Collection[str]) -> Mapping[str, str | None]:
    return {p: entry_sha256(top / p) for p in paths}
