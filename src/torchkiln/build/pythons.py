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

torchvision compiles through ``torch.utils.cpp_extension``, which puts the build venv's torch headers on every
command line (``-I<venv>/lib/python3.12/site-packages/torch/include``): a path that differs per Python, and
ccache (in direct and preprocessor mode alike) misses a header it saw at another path. So torchvision's compile
imports torch from one directory for every Python (``Step.torch_site``, ``<tree>/build/torch-site``, on its
PYTHONPATH), where :func:`torch_in_place` links the compiling Python's torch first:
``-I<tree>/build/torch-site/torch/include`` for every Python. In the tree's build directory, it is the same
path from the compiles' directory (``build/temp.*``, which ccache makes paths relative to) wherever the work
directory is: a work directory at another place relative to the tree hits the same objects. A unit that does
not include Python.h then preprocesses to the same text, and ccache's preprocessor mode (which does not hash
``-I``: the Python's include directory differs) serves it, when the Python's own compile flags are the same:
setuptools passes the interpreter's CFLAGS, and CPython 3.11 gives ``-fwrapv`` where 3.12 and later give
``-fno-strict-overflow``, so 3.11 and 3.12 never share an object.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from torchkiln.errors import TorchkilnError
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


def torch_in_place(step: Step) -> str | None:
    """Link ``<torch_site>/torch`` to the torch of ``step``'s build venv (``VIRTUAL_ENV``), replacing the link
    another Python left (a rename: never a moment without one); returns what was linked, for the display.
    Nothing for a step without ``torch_site``, or when the link is already this venv's."""
    if not step.torch_site:
        return None
    venv = Path(step.env["VIRTUAL_ENV"])
    found = sorted(p.parent for p in venv.glob("lib/python3*/site-packages/torch/__init__.py"))
    if len(found) != 1:
        raise TorchkilnError(
            f"{step.name}: expected one torch in {venv}/lib/python3*/site-packages, found {len(found)} "
            "(the torch install step puts it there: run the build again with --force)"
        )
    # the venv's torch itself (a venv linked to a store entry links its torch there: one hop, not two, for
    # each of the compile's lookups of torch's files)
    link, target = Path(step.torch_site) / "torch", Path(os.path.realpath(found[0]))
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return None
    link.parent.mkdir(parents=True, exist_ok=True)
    temporary = link.with_name(f".torch.{os.getpid()}")
    if os.path.lexists(temporary):
        temporary.unlink()
    temporary.symlink_to(target, target_is_directory=True)
    os.replace(temporary, link)
    return f"torch at {link} -> {target}"
