"""torchvision's compiles against torch 2.6 go through the recipe's ccache (issue 19 item 8), with real ccache
and upstream's real torch 2.6.0 (its wheel and dependencies installed once into a cached venv).

torch 2.6's torch.utils.cpp_extension puts no ccache in front of the compiler (2.12 and later do:
data/compat.toml ``cpp_extension_launcher``), so the plan adds ``torchvision:launchers`` (compiler names that
run ccache, torchkiln.cache.masquerade) and puts that directory first on torchvision's compile PATH. The
extension built is tests/data/ext_project (two translation units through BuildExtension and ninja, what
torchvision's setup.py uses; the 44 of tests/data/vision_like would cost CI minutes for the same path).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w
from kit import ROOT, realtrees
from kit.imagekit import need

from torchkiln import cache
from torchkiln.plan.make import make_plan
from torchkiln.plan.model import Plan, Step
from torchkiln.process.environ import compose
from torchkiln.recipe.compat import compat
from torchkiln.recipe.loader import load_recipe
from torchkiln.shipped import tomllib

pytestmark = pytest.mark.integration

EXT = ROOT / "tests" / "data" / "ext_project"
CPU = ROOT / "recipes" / "torch-2.13-cpu-py311.toml"


@pytest.fixture(scope="module")
def torch26() -> Path:
    """The python of a venv with upstream's torch 2.6.0 (+cu124: imports without a GPU) and the build tools."""
    return realtrees.pypi_venv("torch==2.6.0", extra=("setuptools>=77.0.3", "wheel", "build", "ninja"))


def host_gcc() -> int:
    done = subprocess.run([need("gcc"), "-dumpversion"], capture_output=True, text=True, check=True)
    return int(done.stdout.split(".")[0])


def plan_2_6(tmp_path: Path, tree: Path) -> Plan:
    """A torch 2.6 CPU recipe (this host's gcc as build.gcc, ccache in tmp_path), torchvision only, over
    ``tree``."""
    doc = tomllib.loads(CPU.read_text())
    doc["recipe"]["name"] = "torch-2.6-cpu-py311"
    doc["torch"].update(ref="v2.6.0", version="2.6.0")
    doc["torchvision"].update(ref="v0.21.0", version="0.21.0")
    doc["build"]["gcc"] = host_gcc()
    doc["cache"] = {"kind": "ccache", "dir": str(tmp_path / "ccache")}
    path = tmp_path / "torch-2.6-cpu-py311.toml"
    path.write_text(tomli_w.dumps(doc))
    return make_plan(
        load_recipe(path),
        workdir=tmp_path / "work",
        dist=tmp_path / "dist",
        only="torchvision",
        source_dirs={"torchvision": tree},
    )


def build(python: Path, plan: Plan, wheel: Step, path_prepend: tuple[str, ...]) -> cache.CacheStats:
    """The plan's torchvision:wheel step as the build runs it (its env, the cache session's layer, its PATH),
    with the cached venv's python; the in-tree build/ emptied first, so every object is compiled again."""
    shutil.rmtree(Path(str(wheel.cwd)) / "build", ignore_errors=True)
    base = compose(os.environ, path_prepend=path_prepend)
    session = cache.open_session(plan.cache, base)
    env = compose(os.environ, wheel.env, session.public_env, path_prepend=path_prepend)
    env.pop("VIRTUAL_ENV")
    argv = [str(python), *wheel.argv[1:]]
    done = subprocess.run(argv, cwd=wheel.cwd, env=env, capture_output=True, text=True, check=False)
    stats = session.close()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert stats is not None
    return stats


def test_torch_2_6_extension_compiles_hit_the_cache_through_the_launchers(
    torch26: Path, tmp_path: Path
) -> None:
    need("ccache")
    probe = "import torch.utils.cpp_extension as c; print(torch.__version__, hasattr(c, '_wrap_compiler'))"
    said = subprocess.run(
        [torch26, "-c", f"import torch; {probe}"], capture_output=True, text=True, check=True
    )
    assert said.stdout.split() == ["2.6.0+cu124", "False"]  # no launcher of its own ...
    assert compat()["torch"]["2.6"]["cpp_extension_launcher"] is False  # ... as the data says
    tree = tmp_path / "ext"
    shutil.copytree(EXT, tree)
    plan = plan_2_6(tmp_path, tree)
    steps = {s.name: s for s in plan.steps}
    launchers, wheel = steps["torchvision:launchers"], steps["torchvision:wheel"]
    assert wheel.env["CXX"] == f"g++-{host_gcc()}" and wheel.env["CC"] == f"gcc-{host_gcc()}"
    venv_bin = str(torch26.parent)
    # Without the launchers: torch 2.6 compiles without ccache (the cache sees nothing).
    bare = build(torch26, plan, wheel, (venv_bin,))
    assert (bare.hits, bare.misses) == (0, 0), bare
    # The plan's launcher step, run as the build runs it; then twice through it: misses, then hits.
    subprocess.run([sys.executable, *launchers.argv[1:]], check=True)
    masquerade = wheel.path_prepend[0]
    assert Path(masquerade, f"g++-{host_gcc()}").resolve() == Path(need("ccache")).resolve()
    cold = build(torch26, plan, wheel, (masquerade, venv_bin))
    assert (cold.hits, cold.misses) == (0, 2), cold
    warm = build(torch26, plan, wheel, (masquerade, venv_bin))
    assert (warm.hits, warm.misses) == (2, 0), warm


def test_no_launchers_where_torch_puts_its_own(tmp_path: Path) -> None:
    """torch 2.13 (the CPU recipe) wraps by itself: no launcher step, torchvision's PATH as before."""
    plan = make_plan(load_recipe(CPU), workdir=tmp_path / "w", dist=tmp_path / "d")
    names = [s.name for s in plan.steps]
    assert "torchvision:launchers" not in names
    wheel = next(s for s in plan.steps if s.name == "torchvision:wheel")
    assert wheel.path_prepend == (str(tmp_path / "w" / "venv" / "bin"),)
