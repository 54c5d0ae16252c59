"""A work directory anywhere hits the objects another work directory's build of the same sources put in the
compiler cache, and gives the same wheel (issue 47 item 1: fresh work directories and second builders).

ccache hashes paths under its basedir relative to the compile's directory. torchvision's compiles run in the
tree's ``build/temp.*`` and read torch's headers through ``build/torch-site`` (torchkiln.build.pythons): the
same relative path wherever the work directory is; the one work-directory path left on their command lines,
setuptools' ``-I<venv>/include``, is out of ccache's hash (``CCACHE_IGNOREOPTIONS``). Before, a work directory
placed otherwise relative to its tree than the first builder's got no direct hit, and 2 of the stand-in's 5
units missed outright.

The cases are where a user puts a work directory: beside the tree under another name, deeper elsewhere, and
inside the tree (``.torchkiln``, the default when building from it). (A tree and work directory with no common
parent but ``/`` still miss: the basedir is then the work directory, and the tree's paths are hashed as they
are, absolute, where the first builder's were relative.) Each builds a fresh copy of the stand-in tree (a
tree an earlier build wrote into carries its generated version.py: another source state) with the first
builder's cache and environment store.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kit.imagekit import need
from kit.signalkit import UNITS, Cell, make_tree, write_recipe

pytestmark = pytest.mark.integration

PLACES = {
    "beside, another name": ("t/vision", "t/build-2"),
    "deeper elsewhere": ("t2/vision", "x/y/z/work"),
    "inside the tree": ("t3/vision", "t3/vision/.torchkiln"),
}


@dataclass(frozen=True)
class Placed(Cell):
    """A cell whose tree and work directory are where the case puts them, with the first builder's cache."""

    at_tree: Path = Path()
    at_work: Path = Path()
    at_cache: Path = Path()

    @property
    def tree(self) -> Path:
        return self.at_tree

    @property
    def work(self) -> Path:
        return self.at_work

    @property
    def cache(self) -> Path:
        return self.at_cache


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    for tool in ("ccache", "ninja", "c++", "python3.11"):
        need(tool)
    root = tmp_path_factory.mktemp("place")
    recipe = write_recipe(root / "place.toml")
    cell = Cell(root / "a", recipe, "ccache", env_store=str(root / "envs"))
    make_tree(cell.tree)
    done = cell.build()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    yield {"root": root, "recipe": recipe, "cell": cell, "sha256": cell.wheel_sha256()}
    shutil.rmtree(root, ignore_errors=True)


def _check(cell: Cell, first: dict[str, object]) -> None:
    make_tree(cell.tree)
    done = cell.build()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    counts = json.loads((cell.dist / "manifest.json").read_text())["cache"]
    units = len(UNITS) + 1  # and the spin unit
    assert (counts["hits"], counts["misses"]) == (units, 0), done.stdout[-2000:]
    assert cell.wheel_sha256() == first["sha256"]


@pytest.mark.parametrize("place", list(PLACES))
def test_a_work_directory_anywhere_hits_the_first_builders_objects(
    first: dict[str, object], place: str
) -> None:
    root, a = Path(str(first["root"])), first["cell"]
    assert isinstance(a, Cell)
    tree, work = PLACES[place]
    base = root / place.replace(" ", "-").replace(",", "")
    recipe, store = Path(str(first["recipe"])), str(root / "envs")
    cell = Placed(
        base, recipe, "ccache", env_store=store, at_tree=base / tree, at_work=base / work, at_cache=a.cache
    )
    _check(cell, first)
