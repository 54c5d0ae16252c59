"""The version a source tree states for itself, and whether a wheel's label agrees with it.

torch and torchvision state their version in ``version.txt`` at the top of the tree; their build scripts
append the git sha to it unless ``PYTORCH_BUILD_VERSION`` (torch) or ``BUILD_VERSION`` (torchvision) gives
the wheel's exact version, which is how torchkiln labels a wheel. Upstream's own release trees say (checked on
the release sources, Debian's orig tarballs of PyTorch 2.6.0 and torchvision 0.21.0): ``2.6.0a0`` for torch
(every release tag of PyTorch carries ``X.Y.Za0``: the branch's development marker, the release build labels
the wheel ``X.Y.Z``) and ``0.21.0`` for torchvision.

What a tree states (:func:`tree_version`): the file's text with the whitespace around it removed (spaces,
tabs, LF, CRLF, as upstream's scripts strip it), which must be one line of UTF-8 without a byte-order mark
and one PEP 440 version as ``packaging`` reads it; anything else states no version and is refused by name
(absent, empty, two lines, a byte-order mark, not UTF-8, longer than :data:`MAX_BYTES`, not a version). The
file as read (its text and sha256) is what the manifest, the lock file and the provenance record beside the
label (:func:`record`), whatever it says.

Whether a label agrees (:func:`label_problem`), by what the tree's version is:

=====================================  ===============================================================
the tree states                        the wheel may be labelled
=====================================  ===============================================================
a final release ``X.Y.Z``, or          that release (epoch and release compared as PEP 440 does:
``X.Y.Za0`` (upstream's marker)        ``2.13`` is ``2.13.0``, ``2.13.0.1`` is not); the label's own
                                       pre, post, dev and local parts are the recipe's
a pre-release (``a1``, ``b2``,         exactly that version, as it is (the label's public part equal
``rc1``), a development release        to the tree's version: ``build.pytorch_build_version =
(``.devN``) or a post-release          "2.13.0rc1+cpu"``); any other label is refused naming the part.
(``.postN``)                           torchvision's label is its release: such a tree is refused
a local version (``+evil``)            nothing: refused by name (the local label is the recipe's,
                                       ``build.local_version``; a tree's own would be lost or mixed)
=====================================  ===============================================================

Invariant: the version a wheel is labelled with comes from a check of the tree itself
(:func:`label_problem`), whatever options skip the host checks, and the tree's own text is recorded beside it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from torchkiln.artifacts.lockfile import VersionRecord
from torchkiln.files.digests import file_sha256

# Where each project's tree states its version.
VERSION_FILES: dict[str, str] = {"torch": "version.txt", "torchvision": "version.txt"}
# The variable that labels each project's wheel (PyTorch's setup.py / tools/generate_torch_version.py reads
# PYTORCH_BUILD_VERSION; torchvision's setup.py reads BUILD_VERSION).
LABEL_VARIABLES: dict[str, str] = {"torch": "PYTORCH_BUILD_VERSION", "torchvision": "BUILD_VERSION"}
MAX_BYTES = 4096  # a version file longer than this states no version (and only this much is recorded)
MARKER = ("a", 0)  # upstream's development marker on its release branches: X.Y.Za0 is release X.Y.Z
BOM = "\ufeff"
PRE_NAMES = {"a": "an alpha", "b": "a beta", "rc": "a release candidate"}


@dataclass(frozen=True)
class TreeVersion:
    project: str
    path: Path  # the version file
    text: str | None  # what it states: its text without the whitespace around it; None when absent
    release: Version | None  # the release it belongs to (2.12.0 of 2.12.0a0 and of 2.12.0rc1)
    read: str | None = None  # the file exactly as read (UTF-8, undecodable bytes escaped; MAX_BYTES at most)
    sha256: str | None = None  # of the file's bytes
    version: Version | None = None  # the PEP 440 version it states; None when it states none
    problem: str | None = None  # why it states no version, by name

    @property
    def final(self) -> bool:
        """Whether it states a final release, or upstream's marker ``X.Y.Za0`` (which is one)."""
        v = self.version
        if v is None or v.dev is not None or v.post is not None or v.local is not None:
            return False
        return v.pre is None or v.pre == MARKER

    def parts(self) -> list[str]:
        """What makes it other than a final release, each named (``a release candidate (rc1)``)."""
        v = self.version
        if v is None:
            return []
        out = []
        if v.pre is not None and v.pre != MARKER:
            out.append(f"{PRE_NAMES[v.pre[0]]} ({v.pre[0]}{v.pre[1]})")
        if v.post is not None:
            out.append(f"a post-release (.post{v.post})")
        if v.dev is not None:
            out.append(f"a development release (.dev{v.dev})")
        if v.local is not None:
            out.append(f"a local version label (+{v.local})")
        return out


def _stated(text: str) -> tuple[Version | None, str | None]:
    """The version ``text`` (a file's whole text) states, or why none, by name."""
    if text.startswith(BOM):
        return None, "begins with a byte-order mark (U+FEFF), which no version does"
    statement = text.strip(" \t\r\n")
    if not statement:
        return None, "is empty"
    lines = statement.splitlines()
    if len(lines) > 1:
        return None, f"holds {len(lines)} lines (a version is one line)"
    try:
        return Version(statement), None
    except InvalidVersion:
        return None, f"says {statement!r}, which is no PEP 440 version"


def tree_version(project: str, source: Path) -> TreeVersion:
    path = source / VERSION_FILES[project]
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError:
        return TreeVersion(project, path, None, None, problem="is absent or unreadable")
    digest = hashlib.sha256(data).hexdigest() if len(data) <= MAX_BYTES else file_sha256(path)
    read = data[:MAX_BYTES].decode("utf-8", "backslashreplace")
    text: str | None = None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    version: Version | None = None
    problem: str | None
    if len(data) > MAX_BYTES:
        problem = f"is longer than {MAX_BYTES} bytes, which no version is"
    elif text is None:
        problem = "is not UTF-8 text"
    else:
        version, problem = _stated(text)
    shown = text.strip(" \t\r\n") if text is not None and len(data) <= MAX_BYTES else None
    release = Version(version.base_version) if version is not None else None
    return TreeVersion(project, path, shown, release, read, digest, version, problem)


def release_of(label: str) -> Version | None:
    """The release (``MAJOR.MINOR.PATCH``) a label names, None when it is no version."""
    try:
        found = Version(label)
    except InvalidVersion:
        return None
    return Version(".".join(map(str, (found.release + (0, 0))[:3])))


def label_problem(project: str, source: Path, label: str) -> str | None:
    """Why ``label`` cannot be the version of ``project``'s wheel built from the tree ``source``; None when
    it agrees with what the tree states (the module's table)."""
    found = tree_version(project, source)
    head = (
        f"{project}: the wheel would be labelled {label} ({LABEL_VARIABLES[project]}), but the tree {source} "
        f"is not that release: its {found.path.name}"
    )
    if found.version is None:
        return f"{head} {found.problem}"
    try:
        want = Version(label)
    except InvalidVersion:
        return f"{head} says {found.text!r}, and {label!r} is no PEP 440 version"
    tree, said = found.version, f"{head} says {found.text!r}"
    if tree.local is not None:
        return (
            f"{said}: {', '.join(found.parts())}; a wheel's local label is the recipe's (build.local_version), "
            "never the tree's"
        )
    if found.final:
        if Version(want.base_version) == Version(tree.base_version):
            return None
        return said
    if Version(want.public) == tree:
        return None  # labelled as what it is
    return f"{said}: {', '.join(found.parts())}; a wheel built from it is labelled as what it is, {_as_is(project, tree)}"


def _as_is(project: str, tree: Version) -> str:
    if project == "torch":
        return f"{tree} (build.pytorch_build_version = \"{tree}\", with a local label after '+' if wanted)"
    return f"{tree}, which torchvision's label (its release, torchvision.version) cannot be: build a release tree"


def record(project: str, source: Path, label: str | None) -> VersionRecord:
    """What the records keep of the tree's version file beside the label: the file as read, its sha256, and
    how the label was checked against it."""
    found = tree_version(project, source)
    if found.version is None:
        reading = f"states no version: it {found.problem}"
    elif label is None:
        reading = "no label: the build script labels the wheel from the file itself"
    elif found.final and found.version.pre == MARKER:
        reading = f"upstream's development marker a0 of release {found.release}: labelled as that release"
    elif found.final:
        reading = f"the final release {found.release}"
    else:
        reading = f"{', '.join(found.parts())}: labelled as it is"
    return VersionRecord(found.path.name, found.read, found.sha256, label, reading)
