"""Source checkouts: the git commands that fetch a pinned ref, and reading a checkout with git.

Everything runs real ``git`` with argv lists through :mod:`torchkiln.process.runner` (never a shell): recipe strings
such as a ref or a URL are always one argv item, and a git that fails says so (never an empty answer taken
for a result). :func:`lock_source` reads what a checkout is at into the lock file's entry
(:mod:`torchkiln.artifacts.lockfile`): the resolved SHA of the repository and of every submodule, or for a tree that is
no git checkout the sha256 of its contents.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from torchkiln.artifacts.lockfile import SourceLock, Submodule, TreeChange, TreeLink
from torchkiln.errors import TorchkilnError
from torchkiln.files.digests import tree_sha256
from torchkiln.process import runner
from torchkiln.recipe.model import SourceSpec

from .exact import Difference, changes, describe, git_differences, run_git


def _is_local_url(url: str) -> bool:
    return url.startswith("file://") or url.startswith("/")


def fetch_commands(spec: SourceSpec, dest: Path, *, jobs: int = 4) -> list[tuple[str, ...]]:
    """argv of each git command that fetches ``spec`` into ``dest`` (shallow, submodules recursive).

    Every recipe string is one argv item: nothing here goes through a shell. A repository on a local path
    or ``file://`` URL (a mirror on an air-gapped cluster) usually has its submodules mirrored locally as
    well; git >= 2.38 refuses the ``file`` transport for submodules unless asked, so for such a repository
    the submodule update allows it (the user chose the local mirror in the recipe).
    """
    git = ("git", "-C", str(dest))
    submodule_git = (*git, "-c", "protocol.file.allow=always") if _is_local_url(spec.repo) else git
    # `--` before every positional that comes from the recipe or the command line: git never reads one as
    # an option, whatever it holds (the recipe check refuses such values too: recipe.validators.repo_problem).
    return [
        ("git", "init", "--quiet", "--", str(dest)),
        (*git, "remote", "add", "--", "origin", spec.repo),
        (*git, "fetch", "--depth", "1", "--no-tags", "--", "origin", spec.ref),
        (*git, "checkout", "--quiet", "--detach", "FETCH_HEAD"),
        (*submodule_git, "submodule", "update", "--init", "--recursive", "--depth", "1", "--jobs", str(jobs)),
    ]


def git_output(repo: Path, *args: str, errors: str = "replace") -> str:
    """stdout of ``git -C repo args...``; a failure raises TorchkilnError with git's own message.
    ``errors="surrogateescape"`` keeps bytes that are not UTF-8 (``str.encode`` gives them back)."""
    return run_git(repo, args, needed_for="to fetch and pin sources", errors=errors)


def is_git_checkout(path: Path) -> bool:
    """Whether ``path`` is the top of a git work tree (not merely inside one)."""
    if not path.is_dir():
        return False
    if not os.path.lexists(path / ".git") and not ({"GIT_DIR", "GIT_WORK_TREE"} & os.environ.keys()):
        return False  # a work tree's top holds .git (a directory, or a file naming it): no git to ask
    try:
        done = runner.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"])
    except runner.ProcessError:
        return False
    return done.ok and Path(done.stdout.strip()).resolve() == path.resolve()


def checkout_intact(path: Path, head: str | None) -> bool:
    """Whether ``path`` is still the checkout a fetch left: the top of a git work tree (not an empty
    directory, a file, or a tree whose ``.git`` or object store was removed) and, when the fetch recorded
    its ``head``, at that commit with its tree readable."""
    if not is_git_checkout(path):
        return False
    if head is None:
        return True
    found = runner.run(["git", "-C", str(path), "rev-parse", "--verify", "--quiet", "HEAD^{commit}"])
    if not found.ok or found.stdout.strip() != head:
        return False
    return runner.run(["git", "-C", str(path), "cat-file", "-e", "HEAD^{tree}"]).ok


def changed_files(repo: Path) -> list[str]:
    """The tracked files of a checkout that differ from its HEAD (edited, deleted, staged; a submodule whose
    content or commit changed), as ``git status`` lists them. Untracked and ignored files are left out: what
    the tree's identity (torchkiln.build.fingerprint) reads; whether a tree *is* its commit's tree is
    :func:`torchkiln.source.exact.git_differences`."""
    out = git_output(repo, "status", "--porcelain=v1", "-z", "--untracked-files=no")
    entries = out.split("\0")
    changed: list[str] = []
    skip = False
    for entry in entries:
        if skip:  # a rename's or copy's original path follows its new one
            skip = False
            continue
        if len(entry) < 4:
            continue
        changed.append(entry[3:])
        skip = "R" in entry[:2] or "C" in entry[:2]
    return changed


def dirty_checkout(spec: SourceSpec, path: Path, differences: Sequence[Difference], outcome: str) -> str:
    """Why a fetched checkout that is not its commit's tree is not built or published (as ``cargo publish``
    refuses a dirty tree), naming every path that differs and how, and the ways out."""
    return (
        f"{spec.name}: the fetched checkout {path} differs from {spec.ref} of {spec.repo}: "
        f"{describe(differences)}; {outcome}\n"
        f"ways out: make it the commit's tree again (git -C {path} checkout -- . && git -C {path} clean "
        f"-ffdx, and in each submodule: git -C {path} submodule foreach --recursive git clean -ffdx), or "
        f"--allow-dirty to build and publish it (a warning; the manifest, the lock file and the provenance "
        f"record each path with its kind and sha256), or build a tree you change with --source-dir "
        f"{spec.name}=PATH"
    )


def head_commit(repo: Path) -> str:
    return git_output(repo, "rev-parse", "HEAD").strip()


def check_pin(spec: SourceSpec, repo: Path) -> str:
    """HEAD of ``repo``; raises when the recipe pins an exact commit and HEAD is another one.

    A ref (branch or tag) can move; the commit pin is what makes a recipe reproducible, so a mismatch is
    refused before anything is built from the wrong tree.
    """
    head = head_commit(repo)
    if spec.commit is not None and head != spec.commit:
        raise TorchkilnError(
            f"{spec.name}: pin mismatch in {repo}: HEAD is {head} but the recipe's {spec.name}.commit is "
            f"{spec.commit} (ref {spec.ref!r} of {spec.repo} points elsewhere now, or the source dir is "
            f"checked out at another commit). Fix {spec.name}.commit or {spec.name}.ref in the recipe, or "
            "check out the pinned commit."
        )
    return head


_STATE = {" ": "ok", "+": "modified", "-": "uninitialized", "U": "conflict"}


def submodules(repo: Path) -> list[Submodule]:
    """Every submodule, recursively, with the commit checked out (``git submodule status --recursive``)."""
    if not (repo / ".gitmodules").exists():
        return []
    result: list[Submodule] = []
    for line in git_output(repo, "submodule", "status", "--recursive").splitlines():
        if len(line) < 43:
            continue
        state, sha, rest = line[0], line[1:41], line[42:]
        path = rest.split(" (", 1)[0]
        url: str | None = None
        if state != "-":
            try:
                url = git_output(repo / path, "config", "--get", "remote.origin.url").strip() or None
            except TorchkilnError:
                url = None
        result.append(Submodule(path, sha, url, _STATE.get(state, "unknown")))
    return result


def lock_source(
    name: str,
    path: Path,
    *,
    repo: str | None,
    ref: str | None,
    provided: bool,
    tree_digest: str | None = None,
    tree_changes: list[TreeChange] | None = None,
    outside_links: list[TreeLink] | None = None,
) -> SourceLock:
    """Resolve the SHAs of a checkout, and every way its tree differs from its commit (``tree_changes``: given
    by the build, which leaves its own outputs out; else every difference). A tree that is not a git checkout
    has no commit: its contents are hashed instead (``tree_digest``: given when the build hashed the tree,
    without its own outputs). ``outside_links``: the tree's symbolic links that lead out of it (the build
    publishes such a tree only under --allow-dirty)."""
    leaving = list(outside_links or [])
    if not is_git_checkout(path):
        digest = tree_digest if tree_digest is not None else (tree_sha256(path) if path.is_dir() else None)
        return SourceLock(
            name,
            repo,
            ref,
            None,
            dirty=True,
            provided=provided,
            path=str(path),
            tree_sha256=digest,
            outside_links=leaving,
        )
    head = head_commit(path)
    found = tree_changes if tree_changes is not None else changes(path, git_differences(path))
    return SourceLock(
        name,
        repo,
        ref,
        head,
        bool(found),
        provided,
        str(path),
        None,
        submodules(path),
        [c.path for c in found],
        list(found),
        leaving,
    )
