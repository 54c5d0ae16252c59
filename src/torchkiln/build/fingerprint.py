"""Step fingerprints: what a step's result depends on, so an unchanged step is skipped on the next run.

A step's fingerprint hashes its argv, the variables torchkiln sets for it, its working directory, the
identity of the source tree it builds (git HEAD plus uncommitted changes, or file sizes and mtimes for a
tree that is not a git checkout: cheap, for every run, without the files the build itself writes into the tree
such as torchvision's version.py), and the identities of the steps it depends on (for a step that makes
wheels, their content: an unchanged wheel leaves the steps after it alone).
:func:`tree_sha256` hashes a tree's contents (what the lock file records for a tree without a commit). A changed recipe field
changes the env or argv of the steps that read it, and through the dependency chain every later step of
the same project, and nothing else. The state lives in ``<workdir>/state.json``; a step's entry is removed
before it runs and written only after it succeeded, so an interrupted step is never taken as done.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from torchkiln.files import atomic
from torchkiln.files.digests import IGNORED_DIRS, digest, file_sha256, tree_entries, tree_sha256
from torchkiln.source.git import git_output, is_git_checkout

__all__ = [
    "IGNORED_DIRS",
    "Snapshot",
    "State",
    "digest",
    "file_sha256",
    "result_identity",
    "step_fingerprint",
    "snapshot_identity",
    "tree_identity",
    "tree_sha256",
    "tree_snapshot",
    "written_by_build",
]

STATE_FORMAT = 2  # 2: step kinds and environment layers (issue 12); older state means: run everything


# (size, mtime in ns) of each file of a tree that is not a git checkout, by relative path.
Snapshot = dict[str, tuple[int, int]]


def tree_snapshot(path: Path, skip: Collection[Path] = ()) -> Snapshot:
    """Size and mtime of every entry of a source tree (``.git`` and ``skip``, the build's work directory and
    dist/, left out): cheap enough for every run."""
    found: Snapshot = {}
    for relative, full in tree_entries(path, skip=skip):
        try:
            st = os.lstat(full)
        except OSError:
            continue  # vanished while walking
        found[relative] = (st.st_size, st.st_mtime_ns)
    return found


def snapshot_identity(snapshot: Snapshot, exclude: Collection[str] = ()) -> str:
    """Identity of a snapshot without the files in ``exclude`` (those the build itself rewrites)."""
    excluded = frozenset(exclude)
    h = hashlib.sha256()
    for relative in sorted(snapshot):
        if relative not in excluded:
            size, mtime = snapshot[relative]
            h.update(f"{relative}\0{size}\0{mtime}\n".encode())
    return h.hexdigest()


def written_by_build(before: Snapshot, after: Snapshot) -> list[str]:
    """Files a build created or rewrote inside its source tree (its in-tree outputs: torchvision's
    version.py), from snapshots taken before and after it."""
    return sorted(name for name, stat in after.items() if before.get(name) != stat)


def tree_identity(path: Path, exclude: Collection[str] = (), skip: Collection[Path] = ()) -> str:
    """Identity of a source tree: git HEAD + status + diff of a checkout, else (path, size, mtime) of every
    entry but the build's own outputs (``exclude``, what the build's compiles recorded writing into the tree)
    and ``skip``. A git that fails raises (TorchkilnError) rather than hashing nothing."""
    if not path.exists():
        return "missing"
    if is_git_checkout(path):

        def git(*args: str) -> bytes:
            return git_output(path, *args, errors="surrogateescape").encode("utf-8", "surrogateescape")

        head = git("rev-parse", "HEAD")
        changes = git("status", "--porcelain=v1", "--untracked-files=normal", "--ignore-submodules=none")
        diff = git("diff", "HEAD", "--binary") if changes.strip() else b""
        return hashlib.sha256(head + b"\0" + changes + b"\0" + diff).hexdigest()
    return snapshot_identity(tree_snapshot(path, skip), exclude)


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
    "git": (dict,),  # a fetch's record of the checkout's git data (torchkiln.source.tracked.lasting)
    "toolchain": (dict,),
    "env": (dict,),
    "tree_sha256": (str,),
    "tree_outputs": (list,),  # a tree without git: what its compile wrote into it (CompileRun.outputs)
    "facts": (dict, type(None)),
    "venv": (list,),  # a venv step's installed distributions (torchkiln.build.envstore.venv_distributions)
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


def result_identity(fingerprint: str, entry: Mapping[str, Any]) -> str:
    """What the steps after a step see of it: the content of its wheels when it makes wheels (a rebuild that
    gives the same wheels changes nothing after it), else its fingerprint."""
    wheels = entry.get("outputs", {}).get("wheels")
    return digest({"wheels": wheels}) if wheels else fingerprint


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
