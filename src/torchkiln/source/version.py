"""The version a source tree states for itself, and whether a wheel's label agrees with it.

torch and torchvision state their version in ``version.txt`` at the top of the tree; their build scripts
append the git sha to it unless ``PYTORCH_BUILD_VERSION`` (torch) or ``BUILD_VERSION`` (torchvision) gives
the wheel's exact version, which is how torchkiln labels a wheel. Upstream's own release trees say (checked on
the release sources, Debian's orig tarballs of PyTorch 2.6.0 and torchvision 0.21.0): ``2.6.0a0`` for torch
(every release tag of PyTorch carries ``X.Y.Za0``: the branch's development marker, the release build labels
the wheel ``X.Y.Z``) and ``0.21.0`` for torchvision. So a label agrees with a tree when both name the same
release (``MAJOR.MINOR.PATCH``): a pre-release, post-release, dev or local part of either is not compared
(``2.6.0a0`` is release 2.6.0; ``2.6.0+cpu.kiln1`` too), a different patch, minor or major is a mismatch, and
a tree that states no version (no ``version.txt``, or text that is not a version) cannot label anything.

Invariant: the version a wheel is labelled with comes from a check of the tree itself
(:func:`label_problem`), whatever options skip the host checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

# Where each project's tree states its version.
VERSION_FILES: dict[str, str] = {"torch": "version.txt", "torchvision": "version.txt"}
# The variable that labels each project's wheel (PyTorch's setup.py / tools/generate_torch_version.py reads
# PYTORCH_BUILD_VERSION; torchvision's setup.py reads BUILD_VERSION).
LABEL_VARIABLES: dict[str, str] = {"torch": "PYTORCH_BUILD_VERSION", "torchvision": "BUILD_VERSION"}


@dataclass(frozen=True)
class TreeVersion:
    project: str
    path: Path  # the version file
    text: str | None  # what it says, None when absent or unreadable
    release: Version | None  # its release (2.12.0 of 2.12.0a0)


def _version_of(text: str | None) -> Version | None:
    if not text:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None


def tree_version(project: str, source: Path) -> TreeVersion:
    path = source / VERSION_FILES[project]
    try:
        text = path.read_text(encoding="utf-8", errors="replace")[:100].strip()
    except OSError:
        return TreeVersion(project, path, None, None)
    found = _version_of(text.split()[0] if text else None)
    return TreeVersion(project, path, text, Version(found.base_version) if found else None)


def release_of(label: str) -> Version | None:
    """The release (``MAJOR.MINOR.PATCH``) a label names, None when it is no version."""
    found = _version_of(label)
    return Version(".".join(map(str, (found.release + (0, 0))[:3]))) if found else None


def label_problem(project: str, source: Path, label: str) -> str | None:
    """Why ``label`` cannot be the version of ``project``'s wheel built from the tree ``source``; None when
    the tree states the label's release."""
    found = tree_version(project, source)
    want = release_of(label)
    if found.release is not None and want is not None and _same_release(found.release, want):
        return None
    said = f"says {found.text!r}" if found.text is not None else "is absent or unreadable"
    return (
        f"{project}: the wheel would be labelled {label} ({LABEL_VARIABLES[project]}), but the tree {source} "
        f"is not that release: its {found.path.name} {said}"
    )


def _same_release(tree: Version, label: Version) -> bool:
    return (tree.release + (0, 0))[:3] == (label.release + (0, 0))[:3]
