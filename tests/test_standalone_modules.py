"""Modules that run where torchkiln is not installed import only the standard library.

``build/postcheck.py`` runs in the post-build check's clean venv and loads ``artifacts/wheelfile.py`` by path;
``verify/facts.py`` runs in any Python that ``torchkiln recipe describe --python`` names. An import of
torchkiln (or of a third-party package, or a relative one) there fails only in that other interpreter, after
a build: found once by the rebuild benchmark's first checked build, never by a unit test. Each module's
imports, at every level of the file (a function's too), read with ``ast``."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from kit import ROOT

SRC = ROOT / "src" / "torchkiln"
# each module, and what it may import besides the standard library (facts.py reads the torch it describes)
STANDALONE = {
    "build/postcheck.py": set(),
    "artifacts/wheelfile.py": set(),
    "verify/facts.py": {"torch", "torchvision"},
}


def imports(path: Path) -> list[tuple[int, str]]:
    """(level, top-level module) of every import statement in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(0, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, (node.module or "").split(".")[0]))
    return found


@pytest.mark.parametrize("relative", sorted(STANDALONE))
def test_a_module_run_outside_torchkiln_imports_the_standard_library_only(relative: str) -> None:
    found = imports(SRC / relative)
    assert found, relative
    allowed = set(sys.stdlib_module_names) | STANDALONE[relative]
    foreign = [name for level, name in found if level or name not in allowed]
    assert foreign == [], f"{relative} imports {foreign}: it runs where only the standard library is"


def test_the_check_finds_a_torchkiln_import(tmp_path: Path) -> None:
    """The control: the import that broke the check venv is found, as are relative and third-party ones."""
    sample = tmp_path / "m.py"
    sample.write_text("import zipfile\nfrom torchkiln.files import atomic\nfrom . import x\nimport rich\n")
    found = imports(sample)
    assert [n for lvl, n in found if lvl or n not in sys.stdlib_module_names] == ["torchkiln", "", "rich"]
