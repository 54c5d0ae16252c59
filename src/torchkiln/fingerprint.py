"""Step fingerprints: what a step's result depends on, so an unchanged step is skipped on the next run.

A step's fingerprint hashes its argv, the variables torchkiln sets for it, its working directory, the
identity of the source tree it builds (git HEAD plus uncommitted changes, or file sizes and mtimes for a
tree that is not a git checkout: cheap, for every run), and the fingerprints of the steps it depends on.
:func:`tree_sha256` hashes a tree's contents (what the lock file records for a tree without a commit). A changed recipe field
changes the env or argv of the steps that read it, and through the dependency chain every later step of
the same project, and nothing else. The state lives in ``<workdir>/state.json``; a step's entry is removed
before it runs and written only after it succeeded, so an interrupted step is never taken as done.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from . import atomic
from .digests import IGNORED_DIRS, digest, file_sha256, tree_files, tree_sha256
from .source import git_output, is_git_checkout

__all__ = [
    "IGNORED_DIRS",
    "State",
    "digest",
    "file_sha256",
    "step_fingerprint",
    "tree_identity",
    "tree_sha256",
]

STATE_FORMAT = 2  # 2: step kinds and environment layers (issue 12); older state means: run everything


def tree_identity(path: Path) -> str:
    """Identity of a source tree: git HEAD + status + diff of a checkout, else (path, size, mtime) of every
    file. A git that fails raises (TorchkilnError) rather than hashing nothing."""
    if not path.exists():
        return "missing"
    if is_git_checkout(path):

        def git(*args: str) -> bytes:
            return git_output(path, *args, errors="surrogateescape").encode("utf-8", "surrogateescape")

        head = git("rev-parse", "HEAD")
        changes = git("status", "--porcelain=v1", "--untracked-files=normal", "--ignore-submodules=none")
        diff = git("diff", "HEAD", "--binary") if changes.strip() else b""
        return hashlib.sha256(head + b"\0" + changes + b"\0" + diff).hexdigest()
    h = hashlib.sha256()
    for relative, full in tree_files(path):
        try:
            st = full.stat()
        except OSError:
            continue
        h.update(f"{relative}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
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


# What a step's entry in state.json holds, and the type of each part (outputs: those later steps read).
# An entry that does not match (a hand edit, a disk fault, an older torchkiln) is dropped: the step runs
# again, rather than every rerun failing on it until --force.
ENTRY_TYPES: dict[str, tuple[type, ...]] = {
    "fingerprint": (str,),
    "outputs": (dict,),
    "log": (str, type(None)),
    "duration_s": (int, float),
}
OUTPUT_TYPES: dict[str, tuple[type, ...]] = {
    "wheels": (dict,),
    "head": (str,),
    "toolchain": (dict,),
    "env": (dict,),
    "tree_sha256": (str,),
    "facts": (dict, type(None)),
}


def _entry_ok(entry: object) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("fingerprint"), str):
        return False
    if not all(isinstance(entry[k], t) for k, t in ENTRY_TYPES.items() if k in entry):
        return False
    outputs = entry.get("outputs", {})
    if not all(isinstance(outputs[k], t) for k, t in OUTPUT_TYPES.items() if k in outputs):
        return False
    wheels = outputs.get("wheels", {})
    return all(isinstance(k, str) and isinstance(v, str) for k, v in wheels.items())


class State:
    """``<workdir>/state.json``: per step, the fingerprint and outputs of its last successful run.

    A file that cannot be read or is not a state document counts as empty, an entry of the wrong shape as
    absent (``dropped`` names them): damaged state costs a rerun of those steps, never a failing build."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.steps: dict[str, dict[str, Any]] = {}
        self.dropped: list[str] = []
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        if (
            isinstance(data, dict)
            and data.get("format") == STATE_FORMAT
            and isinstance(data.get("steps"), dict)
        ):
            for name, entry in data["steps"].items():
                if _entry_ok(entry):
                    self.steps[name] = entry
                else:
                    self.dropped.append(name)

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
        atomic.write_json(self.path, {"format": STATE_FORMAT, "steps": self.steps})
