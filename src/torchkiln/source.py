"""Source checkouts: the git commands that fetch a pinned ref, and the pin/lock checks.

Everything runs real ``git`` with argv lists (never a shell): recipe strings such as a ref or a URL are
always one argv item. The lock file records what was actually built (the resolved SHA of every repository
and every submodule), so a build can be reproduced or audited long after the branch has moved.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import TorchkilnError
from .recipe import SourceSpec

LOCK_FORMAT = 1


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
    return [
        ("git", "init", "--quiet", str(dest)),
        (*git, "remote", "add", "origin", spec.repo),
        (*git, "fetch", "--depth", "1", "--no-tags", "origin", spec.ref),
        (*git, "checkout", "--quiet", "--detach", "FETCH_HEAD"),
        (*submodule_git, "submodule", "update", "--init", "--recursive", "--depth", "1", "--jobs", str(jobs)),
    ]


def git_output(repo: Path, *args: str, env: Mapping[str, str] | None = None) -> str:
    """stdout of ``git -C repo args...``; a failure raises TorchkilnError with git's own message."""
    argv = ["git", "-C", str(repo), *args]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)  # noqa: S603 - argv list
    except FileNotFoundError:
        raise TorchkilnError("git is not installed (needed to fetch and pin sources)") from None
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        raise TorchkilnError(
            f"git {' '.join(args)} in {repo} failed: {message[-1] if message else done.returncode}"
        )
    return done.stdout


def is_git_checkout(path: Path) -> bool:
    if not path.is_dir():
        return False
    done = subprocess.run(  # noqa: S603 - argv list, no shell
        ["git", "-C", str(path), "rev-parse", "--is-inside-work-tree"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or done.stdout.strip() != "true":
        return False
    top = git_output(path, "rev-parse", "--show-toplevel").strip()
    return Path(top).resolve() == path.resolve()


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


@dataclass(frozen=True)
class Submodule:
    path: str  # relative to the top repository, nested ones included ("third_party/a/b")
    commit: str
    url: str | None
    state: str  # "ok" | "modified" (checked out commit differs from the recorded one) | "uninitialized"


@dataclass(frozen=True)
class SourceLock:
    """What one project was built from."""

    name: str
    repo: str | None
    ref: str | None
    commit: str | None
    dirty: bool
    provided: bool
    path: str
    submodules: list[Submodule] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "repo": self.repo,
            "ref": self.ref,
            "commit": self.commit,
            "dirty": self.dirty,
            "provided": self.provided,
            "path": self.path,
            "submodules": [
                {"path": s.path, "commit": s.commit, "url": s.url, "state": s.state} for s in self.submodules
            ],
        }


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


def lock_source(name: str, path: Path, *, repo: str | None, ref: str | None, provided: bool) -> SourceLock:
    """Resolve the SHAs of a checkout. A provided tree that is not a git checkout records no commit."""
    if not is_git_checkout(path):
        return SourceLock(name, repo, ref, None, dirty=True, provided=provided, path=str(path))
    head = head_commit(path)
    dirty = bool(git_output(path, "status", "--porcelain", "--untracked-files=no").strip())
    return SourceLock(name, repo, ref, head, dirty, provided, str(path), submodules(path))


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to ``path`` through a temporary file and os.replace: never a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_lock(path: Path, recipe_name: str, recipe_sha256: str, locks: list[SourceLock]) -> dict[str, Any]:
    """``<recipe>.lock.json``: the resolved SHA of each repository and submodule. Returns the document."""
    doc = {
        "format": LOCK_FORMAT,
        "recipe": recipe_name,
        "recipe_sha256": recipe_sha256,
        "sources": {lock.name: lock.to_dict() for lock in locks},
    }
    write_json_atomic(path, doc)
    return doc
