"""``dist/<recipe>.lock.json``: what each project was built from, as a typed, versioned document.

For every project: the repository, ref and resolved commit, whether the tree differed from that commit (every
extra, modified or removed path, with the digest of what was built: ``tree_changes``) or was given with
``--source-dir``, every submodule (path, commit, url, state, recursively), and for a tree that is
no git checkout (no commit to name it by) the sha256 of its contents. A build can be reproduced or audited
long after the branch moved; the manifest carries the same entries, and ``torchkiln verify --manifest``
checks the installed wheels' commits against them. Reading a checkout into a :class:`SourceLock` is
:func:`torchkiln.source.git.lock_source`; this module is the document alone (no git, no build machinery: the
verification suite reads it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import jsonfile

LOCK_FORMAT = 2


@dataclass(frozen=True)
class Submodule:
    path: str  # relative to the top repository, nested ones included ("third_party/a/b")
    commit: str
    url: str | None
    state: str  # "ok" | "modified" (checked out commit differs from the recorded one) | "uninitialized"


@dataclass(frozen=True)
class TreeChange:
    """One way the tree that was built differs from its commit (torchkiln.source.exact): ``kind`` is
    ``extra`` (a path the commit lacks: untracked, ignored, in a nested repository), ``modified`` (content,
    mode, type, or a submodule at another commit) or ``removed``; ``sha256`` is the bytes of the file the
    build read there (None when removed, for a directory, a submodule or a symbolic link); ``link`` is a
    symbolic link's own text (as ``readlink`` gives it and git stores it): a link is recorded as a link,
    never as the bytes of what it points to; ``detail`` says what was found."""

    path: str
    kind: str
    sha256: str | None
    detail: str = ""
    link: str | None = None


@dataclass(frozen=True)
class TreeLink:
    """A symbolic link of the tree that leads out of it (what it resolves to, its chain followed to the end,
    lies outside the tree): what a build reads through it is in no record. Refused unless ``--allow-dirty``,
    which records it: ``path`` from the top of the tree, ``link`` its text."""

    path: str
    link: str


@dataclass(frozen=True)
class VersionRecord:
    """The tree's own version file beside the wheel's label (torchkiln.source.version): ``file`` its name,
    ``text`` exactly as read (None: absent; at most 4096 bytes, undecodable bytes as ``\\xNN``), ``sha256``
    of its bytes, ``label`` the version the wheel was labelled with (PYTORCH_BUILD_VERSION, BUILD_VERSION;
    None: none set), ``reading`` how the label was checked against it."""

    file: str
    text: str | None
    sha256: str | None
    label: str | None
    reading: str


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
    # Set when there is no commit: sha256 over every entry of the tree (its path, git-style mode and content; a
    # symlink's target), ``.git`` and the build's own outputs left out (files this work directory's compile
    # steps wrote, unchanged since; torchkiln.files.digests.tree_sha256).
    tree_sha256: str | None = None
    submodules: list[Submodule] = field(default_factory=list)
    # The paths that differ from ``commit`` (``dirty``): a fetched checkout is published with them only under
    # --allow-dirty; a --source-dir tree is the user's to change. ``tree_changes`` says how each differs,
    # with the digest of what was built (the build's own outputs are no change).
    changed: list[str] = field(default_factory=list)
    tree_changes: list[TreeChange] = field(default_factory=list)
    # The tree's symbolic links that lead out of it (a tracked one too): published only under --allow-dirty.
    outside_links: list[TreeLink] = field(default_factory=list)
    # Its version file as read, beside the label its wheel got (None in records from before issue 45).
    version: VersionRecord | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = jsonfile.to_data(self)
        return data


@dataclass(frozen=True)
class Lock:
    format: int
    recipe: str
    recipe_sha256: str
    sources: dict[str, SourceLock]


def write_lock(path: Path, recipe_name: str, recipe_sha256: str, locks: list[SourceLock]) -> Lock:
    """``<recipe>.lock.json`` (atomically). Returns the document."""
    lock = Lock(LOCK_FORMAT, recipe_name, recipe_sha256, {source.name: source for source in locks})
    jsonfile.write(path, lock)
    return lock


def load_lock(path: Path) -> Lock:
    """Read a lock file; DocumentError (exit 2) naming the file and each bad field otherwise."""
    return jsonfile.read(path, Lock, what="lock file", version=LOCK_FORMAT)
