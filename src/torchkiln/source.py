"""Source checkouts: the git commands that fetch a pinned ref, and the pin/lock checks."""

from __future__ import annotations

from pathlib import Path

from .recipe import SourceSpec


def fetch_commands(spec: SourceSpec, dest: Path, *, jobs: int = 4) -> list[tuple[str, ...]]:
    """argv of each git command that fetches ``spec`` into ``dest`` (shallow, submodules recursive).

    Every recipe string is one argv item: nothing here goes through a shell.
    """
    git = ("git", "-C", str(dest))
    return [
        ("git", "init", "--quiet", str(dest)),
        (*git, "remote", "add", "origin", spec.repo),
        (*git, "fetch", "--depth", "1", "--no-tags", "origin", spec.ref),
        (*git, "checkout", "--quiet", "--detach", "FETCH_HEAD"),
        (*git, "submodule", "update", "--init", "--recursive", "--depth", "1", "--jobs", str(jobs)),
    ]
