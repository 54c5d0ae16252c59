"""One recipe, several Pythons, built for real (issue 23 item 2): ``python.versions = ["3.11", "3.12"]``.

tests/data/pythons_project stands in for torch (``--only torch --source-dir torch=<copy>``): setup.py runs
CMake and ninja in the in-tree build/, six core units never see a Python include directory (torch's
libtorch_cpu) and the module includes Python.h (torch_python). The plan's own steps make each Python's venv
(pip and the build tools from the index, as a real build does), build each wheel, and publish both with one
manifest. With an empty ccache the first Python misses every unit; the second must hit the six core units
(same paths, same command lines: its build/ is parked apart and brought back into the tree) and miss only
the module. Needs a second Python (python3.12: on PATH, or pyenv's, which CI's machines have beside the 3.11
nox runs on); without one it skips, and under CI=true it fails.
"""

from __future__ import annotations

import glob
import io
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from kit import ROOT
from kit.imagekit import need, require
from rich.console import Console

from torchkiln.artifacts.manifest import load_manifest
from torchkiln.build.loop import BuildOptions, run_build
from torchkiln.cache import resolve_cache
from torchkiln.plan.make import make_plan
from torchkiln.recipe.loader import parse_recipe

pytestmark = pytest.mark.integration

HERE = ROOT / "tests"
PROJECT = HERE / "data" / "pythons_project"
RECIPE = (
    (HERE / "data" / "ext-cpu-test.toml")
    .read_text()
    .replace('version = "3.11"', 'versions = ["3.11", "3.12"]')
)
CORE_UNITS = 6  # csrc/core_*.cpp


def second_python(bindir: Path) -> bool:
    """A python3.12 with its headers linked into ``bindir`` (put first on the build's PATH): the one on PATH,
    else pyenv's (its shim on PATH runs no Python unless pyenv is told which)."""
    found = shutil.which("python3.12")
    candidates = [found] if found else []
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")))
    probe = (
        "import sysconfig, pathlib; print(pathlib.Path(sysconfig.get_path('include'), 'Python.h').is_file())"
    )
    for exe in candidates:
        done = subprocess.run([exe, "-c", probe], capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip() == "True":
            bindir.mkdir()
            (bindir / "python3.12").symlink_to(exe)
            return True
    return False


def test_two_pythons_two_wheels_one_manifest_and_the_second_hits_the_core_units(tmp_path: Path) -> None:
    for tool in ("ccache", "ninja", "cmake", "c++", "python3.11"):
        need(tool)
    bindir = tmp_path / "bin"
    # CI's machines carry pyenv's 3.12 beside its 3.11
    require(second_python(bindir), "no python3.12 with its headers (on PATH or under ~/.pyenv)")
    environ = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    src = tmp_path / "src"
    shutil.copytree(PROJECT, src)
    recipe = parse_recipe(RECIPE.encode(), str(tmp_path / "ext-cpu-test.toml"))
    cache = resolve_cache(recipe.cache, kind="ccache", dir=tmp_path / "ccache")
    plan = make_plan(
        recipe,
        workdir=tmp_path / "work",
        dist=tmp_path / "dist",
        source_dirs={"torch": src},
        only="torch",
        cache=cache,
        jobs=2,
    )
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=False, highlight=False)
    result = run_build(plan, BuildOptions(console=console, skip_postcheck=True, environ=environ))

    names = sorted(p.name for p in result.wheels)
    assert names == [
        "kiln_pythons-2.13.0+cpu-cp311-cp311-linux_x86_64.whl",
        "kiln_pythons-2.13.0+cpu-cp312-cp312-linux_x86_64.whl",
    ], out.getvalue()
    manifest = load_manifest(tmp_path / "dist" / "manifest.json")
    assert manifest.recipe.pythons == ["3.11", "3.12"]
    assert sorted((w.name, w.python) for w in manifest.wheels) == [(names[0], "3.11"), (names[1], "3.12")]
    ran = {s.name for s in manifest.steps if s.status == "ran"}
    assert {"torch:wheel", "torch:wheel@3.12", "build-env:venv", "build-env:venv@3.12"} <= ran
    # the first Python missed all seven units; the second hit the six that do not include Python.h and
    # missed the module (each CMake configure also compiles its compiler check, in a scratch dir of a random
    # name: one miss each)
    assert manifest.cache is not None
    assert (manifest.cache.hits, manifest.cache.misses) == (CORE_UNITS, CORE_UNITS + 2 + 2), out.getvalue()
    # each wheel's module was compiled against its own Python's headers, and links the same core
    for name, python in ((names[0], "python3.11"), (names[1], f"{bindir}/python3.12")):
        site = tmp_path / f"site-{python[-4:]}"
        with zipfile.ZipFile(tmp_path / "dist" / name) as wheel:
            wheel.extractall(site)
        probe = "import kiln_pythons as k; print(k.python(), k.checksum())"
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, cwd=site, check=True)
        version, checksum = done.stdout.strip().rsplit(" ", 1)
        assert version == f"(3, {python[-2:]})"
        assert int(checksum) > 0
    # each Python's build dir is kept: the 3.11 one parked, the 3.12 one in the tree
    assert (tmp_path / "work" / "builds" / "3.11" / "torch" / "build" / "cmake" / "CMakeCache.txt").is_file()
    assert "3.12" in (src / "build" / "cmake" / "CMakeCache.txt").read_text()

    # nothing changed: a no-op, each Python's steps skipped
    again = run_build(plan, BuildOptions(console=console, skip_postcheck=True, environ=environ))
    assert not {"torch:wheel", "torch:wheel@3.12"} & set(again.ran), again.ran
