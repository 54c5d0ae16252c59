"""A build for several Pythons (``python.versions``): each Python's in-tree build directories, one at a time.

torch's setup.py builds in the source tree's ``build/`` (CMake's cache, ninja's objects), torchvision's
setuptools too, and there is one source checkout. Building the Pythons one after the other in the same
``build/`` would reconfigure CMake for each and throw away the incremental build of the others; building them
in directories at different paths would give every compile a different command line, so the compiler cache
could not serve the second Python a translation unit the first compiled. So each Python's ``build/`` is
parked under the work directory (``<workdir>/builds/<python>/<project>/build``, under the cache's basedir)
while another Python's is in the tree, and moved back before its own compile step: every Python compiles at
the same paths, the units that do not include Python.h have the same command lines (hits), and each Python
keeps its incremental build.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from torchkiln.files import atomic
from torchkiln.plan.model import Step

# In a tree's build directory: where it is parked when another Python's takes its place (its Python's home).
MARK = ".torchkiln-parked"


def bring_in(step: Step) -> list[str]:
    """Put the in-tree build directories (``scratch``) of ``step``'s Python in the tree, parking the other
    Python's under their home; returns what was moved, for the display. Nothing for a one-Python step. A
    build directory without a mark (a one-Python build's) is removed: which Python it was for is unknown."""
    if not step.parked:
        return []
    moved: list[str] = []
    for directory in map(Path, step.scratch):
        if os.path.lexists(directory) and not directory.is_dir():
            continue  # a file where the build directory belongs: the compile kind removes it
        home = Path(step.parked) / directory.name
        owner = _owner(directory)
        if owner == home:
            continue
        if directory.exists():
            if owner is None:
                shutil.rmtree(directory)
                moved.append(f"removed {directory} (no Python recorded)")
            else:
                _move(directory, owner)
                moved.append(f"parked {directory} in {owner}")
        if home.is_dir():
            _move(home, directory)
            moved.append(f"{directory} from {home}")
        directory.mkdir(parents=True, exist_ok=True)
        atomic.write_text(directory / MARK, str(home))
    return moved


def _owner(directory: Path) -> Path | None:
    mark = directory / MARK
    return Path(mark.read_text().strip()) if mark.is_file() else None


def _move(source: Path, target: Path) -> None:
    """A rename where both are on one filesystem (a copy otherwise); what was at ``target`` is stale."""
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(source), str(target))
