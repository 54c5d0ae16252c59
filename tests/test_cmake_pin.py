"""CMake 4 and torch 2.6, with real CMake from PyPI (configure only, a two-line project).

CMake 4.0 refuses ``cmake_minimum_required(VERSION < 3.5)``, which torch 2.6's third_party still declares
(pytorch#150167; the fix, pytorch#150203, first shipped in 2.7.0). Two ways through, both from the data:
the release's CMake pin (data/host_tools.toml ``cmake_below``: the build venv's requirement is
``cmake>=3.18,<4``), or the vetted CMake variable ``CMAKE_POLICY_VERSION_MINIMUM`` in the recipe's
``[build.flags]``, which reaches the compile step's environment (the caller's own is stripped).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import zipfile
from pathlib import Path

import pytest
from kit import ROOT, realtrees
from packaging.requirements import Requirement

from torchkiln.plan.make import make_plan
from torchkiln.process.environ import compose
from torchkiln.recipe.loader import load_recipe

pytestmark = pytest.mark.integration

RECIPE_2_6 = ROOT / "recipes" / "torch-2.6-cu124-py310.toml"
REFUSED = "Compatibility with CMake < 3.5 has been removed from CMake"


def cmake_from(wheel: Path, into: Path) -> Path:
    """The cmake binary of a PyPI cmake wheel, unpacked (the wheel ships it under cmake/data/bin)."""
    with zipfile.ZipFile(wheel) as z:
        z.extractall(into)
    binary = next(into.glob("cmake/data/bin/cmake"))
    for tool in binary.parent.iterdir():
        tool.chmod(0o755)
    return binary


@pytest.fixture(scope="module")
def old_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project that declares what torch 2.6's third_party/protobuf/cmake/CMakeLists.txt does: a minimum
    below 3.5 (there: 3.1.3)."""
    project = tmp_path_factory.mktemp("old-project")
    (project / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.4)\nproject(old NONE)\n")
    return project


@pytest.fixture(scope="module")
def cmake4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cmake_from(realtrees.pypi_wheel("cmake==4.4.5"), tmp_path_factory.mktemp("cmake4"))


def configure(
    cmake: Path, project: Path, build: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(cmake), "-S", str(project), "-B", str(build)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_the_2_6_pin_excludes_cmake_4_and_its_cmake_configures(
    old_project: Path, cmake4: Path, tmp_path: Path
) -> None:
    plan = make_plan(load_recipe(RECIPE_2_6), workdir=tmp_path / "work", dist=tmp_path / "dist")
    deps = next(s for s in plan.steps if s.name == "build-env:deps")
    [wanted] = [Requirement(a) for a in deps.argv if a.startswith("cmake")]
    assert str(wanted.specifier) == "<4,>=3.18"
    assert "4.4.5" not in wanted.specifier
    refused = configure(cmake4, old_project, tmp_path / "b4", dict(os.environ))
    assert refused.returncode != 0 and REFUSED in refused.stderr
    # what pip gives for that requirement (the newest 3.x), as the build venv would install it
    pinned = cmake_from(realtrees.pypi_wheel(str(wanted)), tmp_path / "cmake3")
    done = configure(pinned, old_project, tmp_path / "b3", dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert "Build files have been written" in done.stdout


def test_the_vetted_variable_reaches_cmake_4_and_the_callers_does_not(
    old_project: Path, cmake4: Path, tmp_path: Path
) -> None:
    recipe = load_recipe(RECIPE_2_6)
    flags = {**recipe.build.flags, "CMAKE_POLICY_VERSION_MINIMUM": "3.5"}
    with_flag = dataclasses.replace(recipe, build=dataclasses.replace(recipe.build, flags=flags))
    plan = make_plan(with_flag, workdir=tmp_path / "work", dist=tmp_path / "dist")
    env = compose(os.environ, plan.env_for("torch"))
    assert env["CMAKE_POLICY_VERSION_MINIMUM"] == "3.5"
    done = configure(cmake4, old_project, tmp_path / "flag", env)
    assert done.returncode == 0, done.stderr
    # the same variable exported by the caller is stripped: it cannot change a build behind the recipe
    plain = make_plan(recipe, workdir=tmp_path / "work2", dist=tmp_path / "dist2")
    caller = {**os.environ, "CMAKE_POLICY_VERSION_MINIMUM": "3.5"}
    env = compose(caller, plain.env_for("torch"))
    assert "CMAKE_POLICY_VERSION_MINIMUM" not in env
    refused = configure(cmake4, old_project, tmp_path / "caller", env)
    assert refused.returncode != 0 and REFUSED in refused.stderr
