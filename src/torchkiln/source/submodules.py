"""Whether a source tree carries its git submodules: a PyTorch tree without them fails late and obscurely.

A GitHub source archive, a Debian orig tarball or a ``git clone`` without ``--recursive`` has no submodule
contents; PyTorch's build then runs its environment steps, configures, and dies in ``third_party/`` (or in
its setup.py's own check, after a ``git submodule update`` that cannot work outside a checkout). So the build
refuses such a tree first, naming the missing submodules: preflight for a ``--source-dir`` tree, right after
the fetch steps for a fetched checkout.

Which submodules a tree has is what its ``.gitmodules`` lists (each one's ``path``, recursively into the
submodules that are there). A tree without ``.gitmodules`` (a source archive may leave it out, as Debian's
PyTorch 2.6.0 orig tarball does) is checked the way the tree's own setup.py checks it
(``get_submodule_folders()``: without ``.gitmodules``, its fixed list under ``third_party/``; v2.6.0:
gloo, cpuinfo, onnx, fbgemm, cutlass), read from that setup.py, so each release's own list is used. A
submodule is missing when its directory is absent or empty (what ``git submodule init`` without an update
leaves; a directory holding only the ``.git`` link counts as empty), as setup.py's ``not_exists_or_empty``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

FIX = "git submodule update --init --recursive"
SHOWN = 8  # missing paths named in a message; the rest are counted

_PATH = re.compile(r"^\s*path\s*=\s*(.+?)\s*$")


@dataclass(frozen=True)
class Missing:
    """The submodules of ``tree`` that are absent or empty, and where the list of submodules came from."""

    tree: Path
    paths: tuple[str, ...]  # relative to tree
    listed_in: str  # ".gitmodules", or the setup.py rule used for a tree without one

    def names(self) -> str:
        """The first few paths and a count of the rest (a message stays one readable line)."""
        shown = ", ".join(self.paths[:SHOWN])
        more = len(self.paths) - SHOWN
        return shown + (f" and {more} more" if more > 0 else "")

    def found(self) -> str:
        return (
            f"{len(self.paths)} submodule(s) of {self.tree} absent or empty: {self.names()} "
            f"(from {self.listed_in})"
        )


def gitmodules_paths(gitmodules: Path) -> list[str]:
    """The ``path = ...`` entries of a ``.gitmodules`` file (git's config syntax), in file order."""
    try:
        text = gitmodules.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    found = (m.group(1).strip('"') for m in map(_PATH.match, text.splitlines()) if m)
    return [p for p in found if p]


def setup_py_folders(tree: Path) -> list[str]:
    """The folders a PyTorch setup.py checks when its tree has no ``.gitmodules``: the string list in its
    ``get_submodule_folders()``, joined to ``third_party/`` as that function does ([] for another setup.py)."""
    try:
        module = ast.parse((tree / "setup.py").read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return []
    for node in ast.walk(module):
        if isinstance(node, ast.FunctionDef) and node.name == "get_submodule_folders":
            for inner in ast.walk(node):
                if isinstance(inner, ast.List | ast.Tuple) and inner.elts:
                    names = [
                        e.value
                        for e in inner.elts
                        if isinstance(e, ast.Constant) and isinstance(e.value, str)
                    ]
                    if len(names) == len(inner.elts):
                        return [f"third_party/{n}" for n in names]
    return []


def _empty(path: Path) -> bool:
    """Absent, empty, or holding only git's link to the submodule's repository."""
    if not path.is_dir():
        return True
    return all(entry.name == ".git" for entry in path.iterdir())


def _walk(tree: Path, prefix: str, paths: list[str]) -> list[str]:
    """The missing ones of ``paths`` (relative to ``tree``), and recursively those of the submodules there."""
    missing: list[str] = []
    for path in paths:
        where = tree / path
        if _empty(where):
            missing.append(prefix + path)
        elif (where / ".gitmodules").is_file():
            missing += _walk(where, f"{prefix}{path}/", gitmodules_paths(where / ".gitmodules"))
    return missing


def missing_submodules(tree: Path) -> Missing | None:
    """The submodules ``tree`` declares and lacks; None when it has them all (or declares none)."""
    gitmodules = tree / ".gitmodules"
    if gitmodules.is_file():
        paths, listed_in = gitmodules_paths(gitmodules), ".gitmodules"
    else:
        paths = setup_py_folders(tree)
        listed_in = "setup.py get_submodule_folders(); the tree has no .gitmodules"
    missing = _walk(tree, "", paths)
    return Missing(tree, tuple(missing), listed_in) if missing else None
