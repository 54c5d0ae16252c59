"""A damaged venv is made again before the build relies on it (issue 47 item 4), on real compiles.

The issue's case: a build venv with ``torch/lib/libtorch_global_deps.so`` removed (a half-finished pip, a disk
clean-up) was taken as intact, and the next build that compiled failed on the missing file, ``--force`` too,
until the venv was removed by hand. Here each kind of damage (a file removed, a ``.py`` changed, a file
truncated in place) is done to the build venv, to the environment store's entry and to the check venv, and
the next build says so in one line, makes the venv again (from the store's entry when that is sound, else
by running its steps again) and succeeds: a real compile of the stand-in tree (tests/data/ext_project, as
torchvision, against torch 2.13.0+cpu installed by the plan's own steps) giving the undamaged build's wheel,
byte for byte; a real post-build check of upstream's torch wheel giving the same verdict.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from kit import ROOT, realtrees
from kit.ext_recipe import ext_recipe_text
from kit.imagekit import need
from rich.console import Console
from test_build import checks_only, describing_the_wheel

from torchkiln.build.envstore import linked_origin
from torchkiln.build.loop import BuildOptions, BuildResult, run_build
from torchkiln.cache import resolve_cache
from torchkiln.plan.make import make_plan
from torchkiln.plan.model import Plan
from torchkiln.recipe.loader import load_recipe

pytestmark = pytest.mark.integration

EXT = ROOT / "tests" / "data" / "ext_project"
SITE = "lib/python3.11/site-packages"
GLOBAL_DEPS = f"{SITE}/torch/lib/libtorch_global_deps.so"
ENV_STEPS = ["build-env:venv", "build-env:pip", "build-env:deps", "torchvision:install-torch"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    for tool in ("ccache", "ninja", "c++", "python3.11"):
        need(tool)
    root = tmp_path_factory.mktemp("venvdamage")
    recipe = root / "recipe.toml"
    recipe.write_text(ext_recipe_text("\n[torchvision.features]\npng = false\njpeg = false\nwebp = false\n"))
    store, checks_store = root / "env-store", root / "checks-store"
    yield {
        "root": root,
        "recipe": recipe,
        "store": store,
        "ccache": root / "ccache",
        "checks-store": checks_store,
    }
    shutil.rmtree(root, ignore_errors=True)


def plan_at(world: dict[str, Path], name: str) -> Plan:
    """A builder of the stand-in tree as torchvision (its own tree and work directory; the machine's store
    and compiler cache)."""
    root = world["root"] / name
    src = root / "src"
    if not src.exists():
        shutil.copytree(EXT, src)
        (src / "version.txt").write_text("0.28.0a0\n")
        os.utime(src / "version.txt", (1_700_000_000, 1_700_000_000))  # one SOURCE_DATE_EPOCH for every tree
    recipe = load_recipe(world["recipe"])
    return make_plan(
        recipe,
        workdir=root / "work",
        dist=root / "dist",
        source_dirs={"torchvision": src},
        only="torchvision",
        cache=resolve_cache(recipe.cache, kind="ccache", dir=world["ccache"]),
        jobs=2,
        env_store=world["store"],
    )


def build(plan: Plan, **options: object) -> tuple[BuildResult, str]:
    out = io.StringIO()
    console = Console(file=out, width=1000, force_terminal=False, highlight=False)
    result = run_build(plan, BuildOptions(console=console, **options))  # type: ignore[arg-type]
    return result, out.getvalue()


def said(out: str, text: str) -> list[str]:
    """The lines of the build's output that contain ``text``."""
    return [line.strip() for line in out.splitlines() if text in line]


def store_entries(store: Path, step: str) -> list[Path]:
    """The store's entries of ``step``, first kept first."""
    metas = {
        p: json.loads((p / "meta.json").read_text()) for p in store.iterdir() if (p / "meta.json").is_file()
    }
    return sorted((p for p, m in metas.items() if m["step"] == step), key=lambda p: metas[p]["kept"])


def store_entry(world: dict[str, Path], step: str) -> Path:
    (found,) = store_entries(world["store"], step)
    return found


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def change(path: Path) -> None:
    """A .py edited and saved as a new file (an editor's save by rename)."""
    text = path.read_text()
    path.unlink()
    path.write_text(text + "\n# edited\n")


@pytest.fixture(scope="module")
def undamaged(world: dict[str, Path]) -> dict[str, object]:
    """Builder A's first build: every env step run for real (torch installed by pip), kept in the store."""
    plan = plan_at(world, "a")
    result, _ = build(plan, skip_postcheck=True)
    assert result.ran == [*ENV_STEPS, "torchvision:wheel", "publish"]
    return {"plan": plan, "wheel": result.wheels[0].read_bytes()}


def test_a_file_removed_from_the_build_venv_is_given_back_from_the_store(undamaged) -> None:
    """The issue's case, with --force: the build venv's own libtorch_global_deps.so removed. Its entry in the
    store is sound (hard links: removing the venv's name left the entry's): the venv is linked to it again."""
    plan = undamaged["plan"]
    (plan.paths.venv / GLOBAL_DEPS).unlink()
    result, out = build(plan, skip_postcheck=True, force=True)
    lines = said(out, "is damaged")
    assert lines == [
        f"{plan.paths.venv} is damaged: {GLOBAL_DEPS} (torch-2.13.0+cpu) is missing: made again from the "
        "environment store"
    ], out
    assert result.ran[0] == "torchvision:wheel" and result.wheels[0].read_bytes() == undamaged["wheel"]
    assert not set(result.ran) & set(ENV_STEPS), "no env step ran again"
    assert (plan.paths.venv / GLOBAL_DEPS).is_file() and linked_origin(plan.paths.venv) is not None
    again, _ = build(plan, skip_postcheck=True)
    assert again.ran == [], "a no-op again"


def test_a_py_changed_in_a_venv_linked_to_the_store_is_made_again_from_scratch(world, undamaged) -> None:
    """A's venv is linked to the store's entry now: a .py changed through it is changed in the entry too. The
    entry is dropped, and the venv's steps run again (the build starts over): the wheel is the same."""
    plan = undamaged["plan"]
    change(plan.paths.venv / SITE / "torch" / "version.py")
    result, out = build(plan, skip_postcheck=True, force=True)
    lines = said(out, "is damaged")
    assert len(lines) == 1 and f"is damaged: {SITE}/torch/version.py (torch-2.13.0+cpu) has " in lines[0]
    assert lines[0].endswith(f"the steps on {plan.paths.venv} run again (the build starts over)"), lines
    statuses = {s.name: s.status for s in result.steps}
    assert statuses["torchvision:install-torch"] == "ran", statuses  # its entry was the damaged one
    assert result.wheels[0].read_bytes() == undamaged["wheel"]
    assert "# edited" not in (store_entry(world, "torchvision:install-torch") / "venv" / SITE / "torch" / "version.py").read_text()  # fmt: skip


def test_a_store_entry_truncated_in_place_is_dropped_and_its_step_runs_again(world, undamaged) -> None:
    """A fresh work directory whose store entry has a library truncated in place: every entry holding that
    file (hard links of one inode: build-env:deps', whose requirements hold torch here, too) and A's venv
    are truncated with it. Each entry is dropped in one line as the build comes to it, and the steps run
    again there."""
    entry = store_entry(world, "torchvision:install-torch")
    truncate(entry / "venv" / GLOBAL_DEPS)
    plan = plan_at(world, "b")
    result, out = build(plan, skip_postcheck=True)
    lines = said(out, "dropped the environment store's entry")
    assert lines[0].startswith(
        f"dropped the environment store's entry of torchvision:install-torch: {entry / 'venv'} is damaged: "
        f"{GLOBAL_DEPS} (torch-2.13.0+cpu) has "
    ), out
    assert all(f"{GLOBAL_DEPS} (torch-2.13.0+cpu) has " in line for line in lines) and len(lines) <= 2, lines
    statuses = {s.name: s.status for s in result.steps}
    assert statuses["torchvision:install-torch"] == "ran", statuses
    assert result.wheels[0].read_bytes() == undamaged["wheel"]
    # A's venv shared the truncated file: the next build of A that compiles finds it so, and is given the
    # store's new entry
    a = undamaged["plan"]
    again, out = build(a, skip_postcheck=True, force=True)
    assert said(out, "is damaged") == [
        f"{a.paths.venv} is damaged: {GLOBAL_DEPS} (torch-2.13.0+cpu) has "
        + said(out, "is damaged")[0].split(" has ", 1)[1]
    ]
    assert said(out, "is damaged")[0].endswith("made again from the environment store"), out
    assert again.wheels[0].read_bytes() == undamaged["wheel"]


# --- the check venv: the post-build check of upstream's torch wheel (test_build's checks-only plans) ------


@pytest.fixture(scope="module")
def checked(world: dict[str, Path]) -> dict[str, object]:
    """A work directory whose wheelhouse holds upstream's torch 2.13.0+cpu wheel, checked once."""
    root = world["root"] / "checks"
    wheelhouse = root / "work" / "wheelhouse" / "torch.deploy"
    realtrees.pypi_wheel_in(wheelhouse)
    here = {"root": root, "work": root / "work"}
    plan = replace(checks_only(here, describing_the_wheel(), "first"), env_store=world["checks-store"])
    result, _ = build(plan)
    assert result.ran[:2] == ["checks:venv", "checks:import"]
    verdict = json.loads((root / "dist-first" / "manifest.json").read_text())["checks"]
    return {"plan": plan, "here": here, "verdict": verdict, "wheelhouse": wheelhouse}


def test_a_damaged_check_venv_is_made_again_before_the_check_runs_in_it(world, checked) -> None:
    """The check venv with a library removed, and its check to run again (its step changed: a torchkiln
    upgrade's postcheck): checks:venv has no entry of its own, so the check venv's steps run again."""
    plan = checked["plan"]
    venv = plan.paths.check_venv
    (venv / GLOBAL_DEPS).unlink()
    steps = [
        replace(s, env={**s.env, "TORCHKILN_TEST_UPGRADE": "1"}) if s.name == "checks:import" else s
        for s in plan.steps
    ]
    result, out = build(replace(plan, steps=steps))
    lines = said(out, "is damaged")
    assert lines == [
        f"{venv} is damaged: {GLOBAL_DEPS} (torch-2.13.0+cpu) is missing: the steps on {venv} run again "
        "(the build starts over)"
    ], out
    assert result.ran[:2] == ["checks:venv", "checks:import"]
    manifest = json.loads((plan.paths.dist / "manifest.json").read_text())
    assert manifest["checks"] == checked["verdict"]


def test_a_damaged_check_venv_entry_is_dropped_and_the_check_runs(world, checked) -> None:
    """Another work directory with the same wheel would be given the check venv's entry: one of its .py
    files changed, it is dropped in one line and the check runs there."""
    entry = store_entries(world["checks-store"], "checks:import")[0]  # the unchanged check's
    change(entry / "venv" / SITE / "torch" / "__init__.py")
    root = world["root"] / "checks-b"
    (root / "work" / "wheelhouse" / "torch.deploy").mkdir(parents=True)
    for wheel in checked["wheelhouse"].glob("*.whl"):
        shutil.copy2(wheel, root / "work" / "wheelhouse" / "torch.deploy")
    plan = replace(checks_only({"root": root, "work": root / "work"}, describing_the_wheel(), "b"), env_store=world["checks-store"])  # fmt: skip
    result, out = build(plan)
    lines = said(out, "dropped the environment store's entry of checks:import")
    assert len(lines) == 1 and f"is damaged: {SITE}/torch/__init__.py (torch-2.13.0+cpu) has " in lines[0]
    assert result.ran[:2] == ["checks:venv", "checks:import"]
    assert json.loads((plan.paths.dist / "manifest.json").read_text())["checks"] == checked["verdict"]
