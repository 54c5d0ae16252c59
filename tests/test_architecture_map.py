"""docs/architecture.md maps every module (issue 48): each module of src/torchkiln is named there, as its path
(``build/loop.py``), its file (``loop.py``), its dotted name (``build.loop``, ``torchkiln.build.loop``) or its
bare name in backquotes, alone or with an attribute (```loop```, ```loop.run_build```). The commands' modules are
mapped by one row (``commands/<name>.py``), as each is one subcommand."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kit import ROOT

PACKAGE = ROOT / "src" / "torchkiln"
MAP = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
MODULES = sorted(
    p.relative_to(PACKAGE)
    for p in PACKAGE.rglob("*.py")
    if p.name != "__init__.py" and "__pycache__" not in p.parts
)


def named(module: Path, text: str) -> bool:
    package, stem = module.parent.as_posix(), module.stem
    if package == "commands":
        return "commands/<name>.py" in text
    dotted = stem if package == "." else f"{package.replace('/', '.')}.{stem}"
    if any(form in text for form in (module.as_posix(), f"{stem}.py", dotted)):
        return True
    # a bare `stem` (or `stem.attribute`) in backquotes
    return re.search(rf"`{re.escape(stem)}(?:[.(:][^`]*)?`", text) is not None


@pytest.mark.parametrize("module", MODULES, ids=str)
def test_every_module_is_on_the_map(module: Path) -> None:
    assert named(module, MAP), f"docs/architecture.md does not name src/torchkiln/{module}"


def test_the_reader_tells_named_from_unnamed() -> None:
    assert named(Path("build/loop.py"), "`loop.run_build` runs a plan")
    assert named(Path("shipped.py"), "| 13 | `errors.py`, `shipped.py` |")
    assert named(Path("cache/remote.py"), "`cache.remote` (a remote store)")
    assert not named(Path("cache/remote.py"), "a remote cache store, `remote_url`")
    assert not named(Path("build/progress.py"), "the compile's progress")
