"""``torchkiln recipe new RECIPE --python X.Y|INTERPRETER`` (issue 37 item 1): the recipe for this host's
Python, made from another, checked before it is written, saying what it was made from; and ``--torch`` refusing
a torch wheel of another Python by its name's tags before anything runs."""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from pathlib import Path

import pytest
from kit import ROOT
from kit.dists import tiny_wheel
from packaging.specifiers import SpecifierSet

from torchkiln.cli import main
from torchkiln.errors import RecipeError, UsageError
from torchkiln.plan.given_torch import resolve_given_torch
from torchkiln.recipe.compat import compat, minor, supported_pythons
from torchkiln.recipe.derive import derived_name, for_pythons
from torchkiln.recipe.loader import load_recipe, recipes_dir

RECIPES = sorted([*recipes_dir().glob("*.toml"), ROOT / "tests" / "data" / "ext-cpu-test.toml"])
CPU = recipes_dir() / "torch-2.13-cpu-py311.toml"
PYTHONS = [f"3.{m}" for m in range(8, 17)]
RUNNING = f"{sys.version_info.major}.{sys.version_info.minor}"
# What may differ between a recipe and the one made from it.
CHANGED = {"name", "description", "python", "pythons", "path", "sha256", "document"}


def supported(path: Path, python: str) -> bool:
    release = compat()["torch"][minor(load_recipe(path).torch.version)]
    return python in SpecifierSet(release["python"])


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
@pytest.mark.parametrize("python", PYTHONS)
def test_every_recipe_is_made_for_every_python_its_release_supports_and_refused_for_the_others(
    path: Path, python: str
) -> None:
    source = load_recipe(path)
    if not supported(path, python):
        with pytest.raises(RecipeError) as info:
            for_pythons(source, path.read_text(), [python])
        assert [p.field for p in info.value.problems] == ["python.version"], info.value.problems
        assert f"Python {python} is not supported by torch" in str(info.value)
        return
    made = for_pythons(source, path.read_text(), [python])
    assert made.recipe.python_versions == (python,)
    assert made.recipe.name == derived_name(source.name, [python])
    same = {f.name for f in dataclasses.fields(source)} - CHANGED
    assert {n: getattr(made.recipe, n) for n in same} == {n: getattr(source, n) for n in same}
    mine, theirs = dict(made.recipe.document), dict(source.document)
    assert {k: v for k, v in mine.items() if k not in ("recipe", "python")} == {
        k: v for k, v in theirs.items() if k not in ("recipe", "python")
    }
    # the header says what it was made from, by path and digest, and what changed
    header = made.text.split("\n\n", 1)[0]
    assert str(path) in header and hashlib.sha256(path.read_bytes()).hexdigest() in header.replace("\n# ", "")
    assert f"python.version {python} instead of {source.python}" in header.replace("\n# ", " ")
    # the source's comments are kept
    comments = [line for line in path.read_text().splitlines() if line.lstrip().startswith("#")]
    assert all(c in made.text for c in comments)


def test_names_say_the_new_pythons() -> None:
    assert derived_name("torch-2.13-cpu-py311", ["3.13"]) == "torch-2.13-cpu-py313"
    assert (
        derived_name("torch-2.13-cu130-py311-aarch64-openblas", ["3.12"])
        == "torch-2.13-cu130-py312-aarch64-openblas"
    )
    assert derived_name("ext-cpu-test", ["3.13t"]) == "ext-cpu-test-py313t"
    assert derived_name("x-py312", ["3.12", "3.13"]) == "x-py312-py313"


def test_several_pythons_make_python_versions(tmp_path: Path) -> None:
    made = for_pythons(load_recipe(CPU), CPU.read_text(), ["3.12", "3.13"])
    assert made.recipe.python_versions == ("3.12", "3.13") and 'versions = ["3.12", "3.13"]' in made.text
    several = tmp_path / "several.toml"
    several.write_text(made.text)
    back = for_pythons(load_recipe(several), made.text, ["3.11"])  # versions replaced by one version
    assert back.recipe.python_versions == ("3.11",) and "versions" not in back.text.split("[python]")[1]
    with pytest.raises(UsageError, match=r"^--python: '3\.x' \(valid: MAJOR\.MINOR"):
        for_pythons(load_recipe(CPU), CPU.read_text(), ["3.x"])
    with pytest.raises(UsageError, match=r"^--python: none, or one given twice"):
        for_pythons(load_recipe(CPU), CPU.read_text(), ["3.12", "3.12"])


def test_a_recipe_of_another_layout_is_written_anew(tmp_path: Path) -> None:
    """Dotted keys instead of tables: no table to edit in place, so the document is written from its parse."""
    text = 'python.version = "3.11"\n' + CPU.read_text().replace('[python]\nversion = "3.11"\n', "")
    assert "[python]" not in text
    dotted = tmp_path / "dotted.toml"
    dotted.write_text(text)
    made = for_pythons(load_recipe(dotted), text, ["3.13"])
    assert made.recipe.python == "3.13" and made.recipe.blas == load_recipe(CPU).blas


def test_the_command_asks_the_interpreter_and_writes_only_a_checked_recipe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    # an interpreter: this one, whatever its version (3.10 to 3.14)
    assert (
        main(["recipe", "new", "torch-2.13-cpu-py311", "--python", sys.executable, "--output", "cpu.toml"])
        == 0
    )
    out = capsys.readouterr().out
    made = load_recipe(tmp_path / "cpu.toml")
    assert made.python == RUNNING and made.name == derived_name("torch-2.13-cpu-py311", [RUNNING])
    assert out == (
        f"wrote cpu.toml: {made.name} (torch-2.13-cpu-py311 for Python {RUNNING}; torch 2.13.0+cpu.kiln1, "
        "torchvision 0.28.0+cpu.kiln1)\n"
    )
    # the check of that recipe on this host names no python problem
    assert main(["check", "cpu.toml", "--only", "torchvision", "--torch", "torch==2.13.0"]) in (0, 2)
    assert "host: python:" not in capsys.readouterr().err
    # an existing file stays unless --force; nothing is written for a Python the release refuses
    before = (tmp_path / "cpu.toml").read_bytes()
    assert main(["recipe", "new", "torch-2.13-cpu-py311", "--python", "3.12", "--output", "cpu.toml"]) == 2
    assert "--output cpu.toml: exists (valid: another file, or --force" in capsys.readouterr().err
    assert (tmp_path / "cpu.toml").read_bytes() == before
    assert (
        main(["recipe", "new", "torch-2.13-cpu-py311", "--python", "3.12", "-o", "cpu.toml", "--force"]) == 0
    )
    assert load_recipe(tmp_path / "cpu.toml").python == "3.12"
    assert main(["recipe", "new", "torch-2.13-cpu-py311", "--python", "3.9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("--python 3.9: python.version: Python 3.9 is not supported by torch 2.13")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu.toml"]
    assert main(["recipe", "new", "torch-2.13-cpu-py311", "--python", "no-such-python3"]) == 2
    assert "neither a Python version nor an interpreter on PATH" in capsys.readouterr().err
    # the default file name is the new recipe's name
    assert main(["recipe", "new", str(CPU), "--python", "3.13"]) == 0
    assert load_recipe(tmp_path / "torch-2.13-cpu-py313.toml").name == "torch-2.13-cpu-py313"


# ------------------------------------------------------------------------------------------------------
# --python: every form the help documents, for every Python the recipe's torch release supports.
# ------------------------------------------------------------------------------------------------------

CPU_PYTHONS = supported_pythons(compat()["torch"][minor(load_recipe(CPU).torch.version)])


def stand_in(directory: Path, name: str, says: str) -> Path:
    """An interpreter named ``name`` that answers the version probe with ``says`` (a Python of that version
    need not be installed here: what is tested is how the command reads the answer)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/sh\necho {says}\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("python", CPU_PYTHONS)
def test_every_documented_python_form_makes_the_recipe(
    python: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """3.14, python3.14 (installed or not: the name says the version), python3 on PATH and a path to an
    interpreter (asked), and their free-threaded forms (3.14t, python3.14t): each makes the recipe for that
    Python. Issue 44: python3.14 was refused where no python3.14 was on PATH."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no interpreter of any name on PATH
    forms = [python, f"python{python}", str(stand_in(tmp_path / "opt" / "bin", f"python{python}", python))]
    monkeypatch.setenv("PATH", str(stand_in(tmp_path / "path", "python3", python).parent))
    forms.append("python3")
    for i, form in enumerate(forms):
        assert main(["recipe", "new", "torch-2.13-cpu-py311", "--python", form, "-o", f"{i}.toml"]) == 0, (
            form,
            capsys.readouterr().err,
        )
        assert load_recipe(tmp_path / f"{i}.toml").python_versions == (python,), form


def test_a_refused_python_form_lists_every_form_with_the_releases_pythons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    for given, why in (
        ("pythonX", "neither a Python version nor an interpreter on PATH"),
        ("python3", "neither a Python version nor an interpreter on PATH"),
        ("/no/such/python3.14", "no such file"),
    ):
        assert main(["recipe", "new", "torch-2.13-cpu-py311", "--python", given]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"--python {given!r}: {why} (valid: a Python version ("), err
        listed = err.split("(valid: a Python version (", 1)[1].split(":", 1)[0]
        assert listed.split(", ") == CPU_PYTHONS, err  # every one the release supports, 3.14 and 3.14t too
        assert "python3.15)" in err and "(python3)" in err and "/usr/bin/python3.15" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------------
# --torch WHEEL: its name's tags against the build's Python(s).
# ------------------------------------------------------------------------------------------------------

# Upstream's wheel names (download.pytorch.org/whl/cpu and PyPI, torch 2.13.0), and the other kinds of tag.
TAGS = {
    "cp310-cp310-manylinux_2_28_x86_64": {"3.10"},
    "cp311-cp311-manylinux_2_28_x86_64": {"3.11"},
    "cp312-cp312-manylinux_2_28_x86_64": {"3.12"},
    "cp313-cp313-manylinux_2_28_x86_64": {"3.13"},
    "cp313-cp313t-manylinux_2_28_x86_64": {"3.13t"},
    "cp314-cp314-manylinux_2_28_x86_64": {"3.14"},
    "cp310-abi3-manylinux_2_28_x86_64": {"3.10", "3.11", "3.12", "3.13", "3.14"},  # the stable ABI
    "py3-none-any": {"3.10", "3.11", "3.12", "3.13", "3.13t", "3.14", "3.14t"},
}
RECIPE_PYTHONS = ["3.10", "3.11", "3.12", "3.13", "3.13t", "3.14", "3.14t"]


@pytest.mark.parametrize("tag", sorted(TAGS))
@pytest.mark.parametrize("python", RECIPE_PYTHONS)
def test_a_torch_wheel_of_another_python_is_refused_by_its_name(
    tmp_path: Path, tag: str, python: str
) -> None:
    wheel = tiny_wheel(tmp_path, "torch", "2.13.0+cpu", tag=tag)
    recipe = dataclasses.replace(load_recipe(CPU), python=python)
    if python in TAGS[tag]:
        assert str(resolve_given_torch(str(wheel), recipe, "torchvision").version) == "2.13.0+cpu"
        return
    with pytest.raises(UsageError) as info:
        resolve_given_torch(str(wheel), recipe, "torchvision")
    message = str(info.value)
    interpreter, abi = tag.split("-")[:2]
    assert message.startswith(
        f"--torch '{wheel}': a wheel for {interpreter}-{abi}, which the build's Python {python} (python.version) cannot install"
    )
    assert "\n" not in message


def test_a_build_for_several_pythons_needs_a_wheel_each_can_install(tmp_path: Path) -> None:
    """One wheel file serves one CPython: for python.versions 3.12 and 3.13, a cp312 wheel is refused
    naming 3.13 (torch==VERSION, a requirement, is resolved per Python by pip)."""
    wheel = tiny_wheel(tmp_path, "torch", "2.13.0+cpu", tag="cp312-cp312-manylinux_2_28_x86_64")
    recipe = dataclasses.replace(load_recipe(CPU), python="3.12", pythons=("3.12", "3.13"))
    with pytest.raises(
        UsageError, match=r"which the build's Python 3\.13 \(python\.versions\) cannot install"
    ):
        resolve_given_torch(str(wheel), recipe, "torchvision")


def test_the_build_refuses_before_any_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wheel = tiny_wheel(tmp_path, "torch", "2.13.0+cpu", tag="cp311-cp311-manylinux_2_28_x86_64")
    other = "3.13" if RUNNING == "3.11" else RUNNING
    recipe = tmp_path / "r.toml"
    recipe.write_text(CPU.read_text().replace('version = "3.11"', f'version = "{other}"'))
    work = tmp_path / "work"
    argv = ["build", str(recipe), "--only", "torchvision", "--torch", str(wheel), "--workdir", str(work)]
    assert main([*argv, "--source-dir", f"torchvision={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"--torch '{wheel}': a wheel for cp311-cp311, which the build's Python {other}")
    assert f"pip download --no-deps --only-binary=:all: --python-version {other}" in err
    assert not work.exists()
