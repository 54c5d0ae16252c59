"""Step fingerprints: what a step's result depends on, so an unchanged step is skipped on the next run.

A step's fingerprint hashes its argv, the variables torchkiln sets for it, its working directory, the
identity of the source tree it builds (git HEAD plus uncommitted changes, or file sizes and mtimes for a
tree that is not a git checkout), and the fingerprints of the steps it depends on. A changed recipe field
changes the env or argv of the steps that read it, and through the dependency chain every later step of
the same project, and nothing else. The state lives in ``<workdir>/state.json``; a step's entry is removed
before it runs and written only after it succeeded, so an interrupted step is never taken as done.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .source import is_git_checkout, write_json_atomic

STATE_FORMAT = 1
# Build outputs inside a source tree: not inputs of the build.
IGNORED_DIRS = frozenset({".git", "build", "dist", "__pycache__", ".eggs", ".torchkiln"})


def digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tree_identity(path: Path) -> str:
    """Identity of a source tree: git HEAD + diff of a checkout, else (path, size, mtime) of every file."""
    if not path.exists():
        return "missing"
    if is_git_checkout(path):

        def run(*args: str) -> bytes:
            argv = ["git", "-C", str(path), *args]
            return subprocess.run(argv, capture_output=True, check=False).stdout  # noqa: S603 - argv list

        head = run("rev-parse", "HEAD")
        changes = run("status", "--porcelain=v1", "--untracked-files=normal", "--ignore-submodules=none")
        diff = run("diff", "HEAD", "--binary") if changes.strip() else b""
        return hashlib.sha256(head + b"\0" + changes + b"\0" + diff).hexdigest()
    h = hashlib.sha256()
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in IGNORED_DIRS and not d.endswith(".egg-info"))
        for name in sorted(files):
            full = Path(root) / name
            try:
                st = full.stat()
            except OSError:
                continue
            h.update(f"{full.relative_to(path)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def step_fingerprint(
    argv: Iterable[str],
    env: Mapping[str, str],
    cwd: str | None,
    inputs: Mapping[str, str],
    deps: Iterable[str],
) -> str:
    return digest(
        {"argv": list(argv), "env": dict(env), "cwd": cwd, "inputs": dict(inputs), "deps": list(deps)}
    )


class State:
    """``<workdir>/state.json``: per step, the fingerprint and outputs of its last successful run."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.steps: dict[str, dict[str, Any]] = {}
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        if (
            isinstance(data, dict)
            and data.get("format") == STATE_FORMAT
            and isinstance(data.get("steps"), dict)
        ):
            self.steps = data["steps"]

    def get(self, step: str) -> dict[str, Any] | None:
        return self.steps.get(step)

    def forget(self, step: str) -> None:
        if self.steps.pop(step, None) is not None:
            self.save()

    def record(self, step: str, entry: dict[str, Any]) -> None:
        self.steps[step] = entry
        self.save()

    def clear(self) -> None:
        self.steps = {}
        self.save()

    def save(self) -> None:
        write_json_atomic(self.path, {"format": STATE_FORMAT, "steps": self.steps})
