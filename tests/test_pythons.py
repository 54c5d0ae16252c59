"""One recipe, several Pythons (issue 23 item 2): ``python.versions`` read and checked against the release's
data, the plan's steps per Python, and each Python's in-tree build directory parked while another's builds.
The integration build (two Pythons, one manifest, cache hits) is tests/test_build_pythons.py."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import tomli_w
from kit import ROOT
from kit.dists import manifest_of, pip_install_target, tiny_wheel
from kit.imagekit import need_torch

from torchkiln.artifacts.manifest import WheelRecord
from torchkiln.build.pythons import MARK, bring_in, torch_in_place
from torchkiln.cli import main
from torchkiln.errors import RecipeError, TorchkilnError
from torchkiln.plan.jobs import GIB, Resources
from torchkiln.plan.make import make_plan
from torchkiln.plan.model import Step
from torchkiln.recipe.loader import parse_recipe
from torchkiln.shipped import tomllib
from torchkiln.verify import provenance
from torchkiln.verify.buildconfig import recipe_checks
from torchkiln.verify.facts import BuildFacts, collect_facts

CPU_RECIPE = ROOT / "recipes" / "torch-2.13-cpu-py311.toml"
BIG = Resources(cpus=64, memory_bytes=512 * GIB)


def recipe_text(python: dict[str, object], torch: str = "2.13") -> str:
    """The shipped CPU recipe with its [python] table replaced, for torch ``torch`` (and its torchvision)."""
    doc = tomllib.loads(CPU_RECIPE.read_text())
    doc["python"] = python
    if torch != "2.13":
        minor = int(torch.split(".")[1])
        doc["torch"].update(version=f"{torch}.0", ref=f"v{torch}.0")
        doc["torchvision"].update(version=f"0.{minor + 15}.0", ref=f"v0.{minor + 15}.0")
    return tomli_w.dumps(doc)


def problems(text: str) -> list[str]:
    with pytest.raises(RecipeError) as info:
        parse_recipe(text.encode(), "x.toml")
    return [str(p) for p in info.value.problems]


def test_versions_list_the_pythons_and_the_first_is_the_recipes_python() -> None:
    recipe = parse_recipe(recipe_text({"versions": ["3.11", "3.12", "3.13"]}).encode(), "x.toml")
    assert recipe.python_versions == ("3.11", "3.12", "3.13")
    assert recipe.python == "3.11"


def test_a_single_version_is_still_one_python() -> None:
    recipe = parse_recipe(recipe_text({"version": "3.12"}).encode(), "x.toml")
    assert (recipe.python, recipe.python_versions) == ("3.12", ("3.12",))


# (id, [python] table, torch minor, words the one problem line must contain)
REFUSED = [
    ("both", {"version": "3.11", "versions": ["3.12"]}, "2.13", "python.versions: given with python.version"),
    ("neither", {}, "2.13", "python.version: missing required key"),
    ("empty", {"versions": []}, "2.13", "python.versions: empty list"),
    ("twice", {"versions": ["3.12", "3.12"]}, "2.13", "python.versions: 3.12 listed more than once"),
    ("malformed", {"versions": ["3.12", "py3.13"]}, "2.13", "python.versions: malformed Python 'py3.13'"),
    ("out-of-range", {"versions": ["3.12", "3.9"]}, "2.13", "Python 3.9 is not supported by torch 2.13"),
    # the package index: torch 2.13.0 ships cp314t wheels but no cp313t (data/compat.toml free_threaded)
    ("no-cp313t-on-2.13", {"versions": ["3.12", "3.13t"]}, "2.13", "torch 2.13 ships no cp313t wheels"),
    # 2.12.0 shipped cp313t, 2.12.1 no longer: the per-minor table refuses it
    ("no-cp313t-on-2.12", {"versions": ["3.13t"]}, "2.12", "torch 2.12 ships no cp313t wheels"),
    ("no-cp314t-on-2.8", {"version": "3.14t"}, "2.8", "Python 3.14t is not supported by torch 2.8"),
]


@pytest.mark.parametrize(("python", "torch", "words"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_refused_pythons_name_the_field(python: dict[str, object], torch: str, words: str) -> None:
    found = problems(recipe_text(python, torch))
    assert len(found) == 1, found
    assert words in found[0]
    assert found[0].startswith("x.toml: python.version")


@pytest.mark.parametrize(
    ("python", "torch"),
    [
        ({"versions": ["3.12", "3.14t"]}, "2.13"),  # cp314t wheels of 2.13.0
        ({"versions": ["3.13", "3.13t"]}, "2.11"),  # cp313t wheels of 2.7.0 to 2.12.0
        ({"version": "3.13t"}, "2.7"),
    ],
)
def test_free_threaded_where_the_release_ships_wheels(python: dict[str, object], torch: str) -> None:
    recipe = parse_recipe(recipe_text(python, torch).encode(), "x.toml")
    assert any(p.endswith("t") for p in recipe.python_versions)


def test_recipe_check_exits_2_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(recipe_text({"versions": ["3.11", "3.13t"]}))
    assert main(["recipe", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: python.versions: Python 3.13t (free-threaded)" in err
    assert "Traceback" not in err


def test_plan_has_each_pythons_steps_sharing_the_sources(tmp_path: Path) -> None:
    recipe = parse_recipe(recipe_text({"versions": ["3.11", "3.12"]}).encode(), "x.toml")
    plan = make_plan(recipe, workdir=tmp_path / "w", resources=BIG)
    names = [s.name for s in plan.steps]
    # the first Python's steps are a one-Python build's; the second's carry its Python
    assert "torch:wheel" in names and "torch:wheel@3.12" in names
    assert "build-env:venv@3.12" in names and "checks:import@3.12" in names
    # one checkout: the fetch steps once
    assert sum(n.startswith("torch:fetch") for n in names) == sum(
        n.startswith("torch:fetch")
        for n in [
            s.name
            for s in make_plan(replace(recipe, pythons=()), workdir=tmp_path / "w", resources=BIG).steps
        ]
    )
    assert not any("@" in n for n in names if ":fetch" in n)
    first, second = plan.steps[names.index("torch:wheel")], plan.steps[names.index("torch:wheel@3.12")]
    # the same tree and build dir, each Python's own venv and wheelhouse, parked apart
    assert first.cwd == second.cwd and first.scratch == second.scratch
    assert first.argv[0] == str(tmp_path / "w" / "venv" / "bin" / "python")
    assert second.argv[0] == str(tmp_path / "w" / "venv-3.12" / "bin" / "python")
    assert first.wheels != second.wheels
    assert (first.parked, second.parked) == (
        str(tmp_path / "w" / "builds" / "3.11" / "torch"),
        str(tmp_path / "w" / "builds" / "3.12" / "torch"),
    )
    venv = plan.steps[names.index("build-env:venv@3.12")]
    assert venv.argv[0] == "python3.12"
    published = plan.published_steps()
    assert set(published) == {
        ("torch", "3.11"),
        ("torch", "3.12"),
        ("torchvision", "3.11"),
        ("torchvision", "3.12"),
    }
    repaired = plan.steps[names.index("torch:repair")]  # torch's final wheel: the first Python's repaired one
    assert plan.wheel_steps()["torch"] is repaired and repaired.reads == (first.wheels,)
    assert plan.steps[names.index("torch:repair@3.12")].reads == (second.wheels,)


def test_one_python_plan_is_unchanged_by_the_feature(tmp_path: Path) -> None:
    recipe = parse_recipe(recipe_text({"version": "3.11"}).encode(), "x.toml")
    plan = make_plan(recipe, workdir=tmp_path / "w", resources=BIG)
    assert all(s.python == "" and s.parked == "" for s in plan.steps)
    assert not any("@" in s.name for s in plan.steps)


def _compile_step(tree: Path, work: Path, python: str) -> Step:
    return Step(
        f"x:wheel@{python}",
        "compile",
        "x",
        ("true",),
        scratch=(str(tree / "build"),),
        python=python,
        parked=str(work / "builds" / python / "x"),
    )


def test_each_python_gets_its_own_build_dir_back_at_the_same_path(tmp_path: Path) -> None:
    tree, work = tmp_path / "src", tmp_path / "work"
    build = tree / "build"
    build.mkdir(parents=True)
    (build / "left-by-a-one-python-build.o").write_text("?")
    bring_in(_compile_step(tree, work, "3.11"))
    # a build dir nobody marked is of an unknown Python: gone
    assert sorted(p.name for p in build.iterdir()) == [MARK]
    (build / "py311.o").write_text("311")
    bring_in(_compile_step(tree, work, "3.12"))
    assert not (build / "py311.o").exists()
    assert (work / "builds" / "3.11" / "x" / "build" / "py311.o").read_text() == "311"
    (build / "py312.o").write_text("312")
    moved = bring_in(_compile_step(tree, work, "3.11"))
    assert (build / "py311.o").read_text() == "311" and not (build / "py312.o").exists()
    assert (work / "builds" / "3.12" / "x" / "build" / "py312.o").read_text() == "312"
    assert len(moved) == 2
    # already in place: nothing moves
    assert bring_in(_compile_step(tree, work, "3.11")) == []
    assert (build / "py311.o").read_text() == "311"


def test_torchvisions_compile_takes_torch_from_one_path_for_every_python(tmp_path: Path) -> None:
    recipe = parse_recipe(recipe_text({"versions": ["3.11", "3.12"]}).encode(), "x.toml")
    plan = make_plan(recipe, workdir=tmp_path / "w", resources=BIG)
    steps = {s.name: s for s in plan.steps}
    # in the tree's build directory: one path from the compiles' directory wherever the work directory is
    site = str(next(s.path for s in plan.sources if s.name == "torchvision") / "build" / "torch-site")
    for name in ("torchvision:wheel", "torchvision:wheel@3.12"):
        assert steps[name].torch_site == site and steps[name].env["PYTHONPATH"] == site
        assert (
            steps[name].env["CCACHE_IGNOREOPTIONS"].split()[0]
            == f"-I{steps[name].env['VIRTUAL_ENV']}/include"
        )
    assert steps["torchvision:wheel@3.12"].env["VIRTUAL_ENV"] == str(tmp_path / "w" / "venv-3.12")
    # torch's own build is CMake's: its headers are in the tree, nothing to link
    assert steps["torch:wheel"].torch_site == "" and "PYTHONPATH" not in steps["torch:wheel"].env


def _venv_with_torch(venv: Path, python: str, marker: str) -> Path:
    torch = venv / "lib" / f"python{python}" / "site-packages" / "torch"
    torch.mkdir(parents=True)
    (torch / "__init__.py").write_text(f"WHICH = {marker!r}\n")
    return torch


def test_the_compiling_pythons_torch_is_the_one_imported_from_the_shared_path(tmp_path: Path) -> None:
    """Real imports through the link (what cpp_extension's __file__-relative include paths read): each
    Python's compile re-points it to its own venv's torch, by a rename, and a venv without torch is an error
    naming the step and the venv."""
    site = tmp_path / "w" / "torch-site"
    torches = {py: _venv_with_torch(tmp_path / f"venv-{py}", py, py) for py in ("3.11", "3.12")}

    def step(py: str) -> Step:
        env = {"VIRTUAL_ENV": str(tmp_path / f"venv-{py}"), "PYTHONPATH": str(site)}
        return Step(f"torchvision:wheel@{py}", "compile", "torchvision", ("true",), env, torch_site=str(site))

    def imported() -> list[str]:
        probe = "import torch, os; print(torch.WHICH, os.path.abspath(torch.__file__))"
        done = subprocess.run(
            [sys.executable, "-c", probe], env={"PYTHONPATH": str(site)}, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert torch_in_place(step("3.11")) == f"torch at {site / 'torch'} -> {torches['3.11']}"
    assert imported() == ["3.11", str(site / "torch" / "__init__.py")]
    assert torch_in_place(step("3.11")) is None  # already this venv's
    assert torch_in_place(step("3.12")) is not None
    assert imported() == ["3.12", str(site / "torch" / "__init__.py")]
    assert sorted(p.name for p in site.iterdir()) == ["torch"]  # no temporary link left
    bare = tmp_path / "venv-3.13"
    (bare / "lib" / "python3.13" / "site-packages").mkdir(parents=True)
    no_torch = replace(step("3.12"), name="torchvision:wheel@3.13", env={"VIRTUAL_ENV": str(bare)})
    with pytest.raises(TorchkilnError, match=r"torchvision:wheel@3.13: expected one torch in .*venv-3.13"):
        torch_in_place(no_torch)
    assert imported()[0] == "3.12"  # the link is left as it was


@pytest.fixture(scope="module")
def real_facts() -> BuildFacts:
    """The facts of the installed torch (the suite's torch 2.13.0 CPU wheel), its Python's among them."""
    need_torch()
    return collect_facts()


def test_verify_compares_the_wheel_of_the_python_running_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_facts: BuildFacts
) -> None:
    """A manifest of a build for 3.11 and 3.12 lists two wheels of the project: an installation is checked
    against the one of its own Python, whichever is listed first."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    mine = tiny_wheel(wheels, "kilnpy", "1.0")
    site = pip_install_target(tmp_path / "site", mine)
    monkeypatch.syspath_prepend(str(site))
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    record = WheelRecord.of(mine, "kilnpy", running)
    other = replace(
        record, name="kilnpy-1.0-cp399-cp399-linux_x86_64.whl", sha256="0" * 64, files_sha256="1" * 64
    )
    facts = replace(real_facts, python_version=running)
    for listed in ([replace(other, python="3.99"), record], [record, replace(other, python="3.99")]):
        results = provenance.manifest_checks(manifest_of(listed, {}), facts)
        assert (results["kilnpy.files"].status, results["kilnpy.wheel_sha256"].status) == ("pass", "pass")
    # the other Python's wheel alone: compared, and it is not what is installed
    results = provenance.manifest_checks(manifest_of([replace(other, python=running)], {}), facts)
    assert results["kilnpy.files"].status == "fail"


def test_the_recipe_check_accepts_each_of_its_pythons_and_names_them(real_facts: BuildFacts) -> None:
    recipe = parse_recipe(recipe_text({"versions": ["3.11", "3.12", "3.14t"]}).encode(), "x.toml")
    for running, status in (("3.11", "pass"), ("3.14", "pass"), ("3.13", "fail")):
        check = recipe_checks(recipe, replace(real_facts, python_version=running))["python"]
        assert (check.status, check.field) == (status, "python.versions")
    assert "expected 3.11 or 3.12 or 3.14t, actual 3.13" in check.message


def test_a_pythons_steps_build_on_its_own_steps_and_the_shared_fetches(tmp_path: Path) -> None:
    recipe = parse_recipe(recipe_text({"versions": ["3.11", "3.12"]}).encode(), "x.toml")
    plan = make_plan(recipe, workdir=tmp_path / "w", resources=BIG)
    names = [s.name for s in plan.steps]

    def deps(name: str) -> set[str]:
        return {names[i] for i in plan.dependencies(names.index(name))}

    torch_fetch = {n for n in names if n.startswith("torch:fetch")}
    env = ("build-env:venv", "build-env:pip", "build-env:deps")
    assert deps("torch:wheel") == torch_fetch | set(env)
    # the second Python's compile: the shared checkout and its own venv, none of the first Python's steps
    assert deps("torch:wheel@3.12") == torch_fetch | {f"{n}@3.12" for n in env}
    checks = deps("checks:import@3.12")
    assert {n for n in checks if "@" not in n} == {n for n in names if ":fetch:" in n}
    assert "torchvision:wheel@3.12" in checks and "torchvision:wheel" not in checks
