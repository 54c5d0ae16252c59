"""Messages that point the right way (issue 20 item 6): each names what is really wrong and the way out."""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

import pytest
from kit import ROOT
from kit.dists import tiny_wheel
from kit.readmekit import readme_blocks

from torchkiln.cli import COMMANDS, RENAMED, build_parser, main
from torchkiln.host import distro
from torchkiln.plan import preflight
from torchkiln.plan.jobs import GIB, Resources
from torchkiln.plan.make import make_plan
from torchkiln.recipe.compat import compat, torch_release_range, torch_releases
from torchkiln.recipe.loader import load_recipe, shipped_names

CPU = ROOT / "recipes" / "torch-2.13-cpu-py311.toml"
CU130 = ROOT / "recipes" / "torch-2.13-cu130-py312.toml"
VISION_LIKE = ROOT / "tests" / "data" / "vision_like"
OS_RELEASES = ROOT / "tests" / "data" / "os-release"
BIG = Resources(cpus=4, memory_bytes=64 * GIB)


def test_readmes_newcomer_path_is_marked_and_quotes_a_whole_check() -> None:
    """The blocks `nox -s newcomer` runs (tests/newcomer) are in README.md in their order; the check it quotes is
    a whole preflight report (a line per problem and the count), one line per missing tool, each with its fix;
    the checkout is a clone; the recipe is made for the system's python3 and is what the check and the build
    use; the first build's --torch is the wheel the block before it downloads; the apt-get lines a user with
    sudo prefixes start their lines."""
    blocks = {b.name: b for b in readme_blocks()}
    quoted = blocks["check-missing"].quoted
    problems = quoted[:-1]
    assert quoted[-1] == f"preflight: {len(problems)} problem(s); nothing was fetched or built"
    named = [re.match(r"host: ([a-z.-]+): found ", line) for line in problems]
    assert all(named) and all("(fix: apt-get install " in line for line in problems), quoted
    assert {m.group(1) for m in named if m} == {
        "cxx", "cc", "python-headers", "cache", *(f"torchvision.features.{p}" for p in ("png", "jpeg", "webp"))
    }  # fmt: skip
    assert blocks["checkout"].commands.startswith('git clone "$TORCHKILN_URL" torchkiln')
    assert "recipe new torch-2.13-cpu-py311 --python python3 --output cpu.toml" in blocks["recipe"].commands
    for name in ("check-missing", "check-ok", "main-job"):
        assert re.search(r"torchkiln (check|build) cpu\.toml", blocks[name].commands), name
    assert (
        "torch==2.13.0+cpu" in blocks["torch-wheel"].commands
        and "--dest wheels " in blocks["torch-wheel"].commands
    )
    assert "--torch wheels/torch-2.13.0+cpu-*.whl" in blocks["main-job"].commands
    for name in ("run-deps", "build-deps"):
        lines = blocks[name].commands.splitlines()
        assert lines and all(line.startswith("apt-get ") for line in lines), lines


def test_readme_states_the_supported_releases_the_data_has() -> None:
    """The range in README.md is the one data/compat.toml covers (the data grows: this says when README
    must follow)."""
    text = (ROOT / "README.md").read_text()
    match = re.search(
        r"\*\*Supported releases: (torch [0-9.]+ to [0-9.]+), with (torchvision [0-9.]+ to [0-9.]+)\*\*", text
    )
    assert match, "README.md states no supported range"
    visions = [compat()["torch"][r]["torchvision"] for r in torch_releases()]
    assert match.group(1) == torch_release_range()
    assert match.group(2) == f"torchvision {visions[0]} to {visions[-1]}"


def parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """A parser and every subparser under it."""
    found = [parser]
    for action in parser._actions:  # noqa: SLF001 - argparse keeps subparsers nowhere public
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for sub in action.choices.values():
                found += parsers(sub)
    return found


@pytest.mark.parametrize("command", list(COMMANDS))
def test_no_parser_takes_an_abbreviated_option(command: str) -> None:
    assert all(not p.allow_abbrev for p in parsers(build_parser(only=command)))


def test_an_abbreviated_option_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    """``--job 4`` was silently taken as ``--jobs 4``."""
    with pytest.raises(SystemExit) as info:
        main(["plan", str(CPU), "--job", "4"])
    assert info.value.code == 2
    assert "unrecognized arguments: --job 4" in capsys.readouterr().err


def test_a_misspelt_shipped_recipe_lists_the_shipped_names_closest_first(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "torch-2.13-cpu-py31"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("torch-2.13-cpu-py31: <file>: no such file, and no shipped recipe of that name")
    names = err.split("closest first: ", 1)[1].rstrip(")\n").split(", ")
    assert sorted(names) == shipped_names() and names[0] == "torch-2.13-cpu-py311", names
    # A path is a path: no list of names.
    assert main(["plan", "/nonexistent/recipe.toml"]) == 2
    assert "closest first" not in capsys.readouterr().err


def test_build_without_a_recipe_shows_the_nox_form(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build"]) == 2
    err = capsys.readouterr().err
    assert "a recipe is required: torchkiln build RECIPE" in err
    assert "nox -s build-wheel -- --recipe RECIPE" in err


def test_an_adopted_tree_is_named_as_the_source_of_its_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A torchvision 0.21 tree built with --accept-source-version does not pair with the recipe's torch:
    the problem is the tree's version, not the recipe file's torchvision.version (which says 0.28.0)."""
    tree = tmp_path / "vision-0.21.0"
    shutil.copytree(VISION_LIKE, tree)
    (tree / "version.txt").write_text("0.21.0\n")
    args = [
        str(CPU),
        "--only",
        "torchvision",
        "--source-dir",
        f"torchvision={tree}",
        "--workdir",
        str(tmp_path),
    ]
    assert main(["check", *args, "--accept-source-version", "torchvision"]) == 2
    line = next(x for x in capsys.readouterr().err.splitlines() if "does not pair" in x)
    assert line.startswith(
        f"torchvision 0.21.0 is the version of the tree {tree} (its version.txt says '0.21.0'), adopted with "
        "--accept-source-version torchvision instead of the recipe file's version: torchvision.version: "
        "torchvision 0.21.0 does not pair with torch 2.13.0"
    ), line
    assert not line.startswith(str(CPU))


def test_only_torchvision_without_a_torch_wheel_is_refused_at_preflight(tmp_path: Path) -> None:
    plan = make_plan(
        load_recipe(CPU), workdir=tmp_path / "w", dist=tmp_path / "d", only="torchvision", resources=BIG
    )
    [finding] = [f for f in preflight.preflight(plan, {"PATH": ""}) if f.check == "torch-wheel"]
    assert (
        finding.found
        == f"no torch 2.13.0+cpu.kiln1 wheel in {tmp_path / 'd'} or {tmp_path / 'w' / 'wheelhouse' / 'torch'}"
    )
    assert (
        "torchkiln build torch-2.13-cpu-py311 --only torch" in finding.fix and "--torch WHEEL" in finding.fix
    )
    # The recipe's torch wheel in dist/ (an earlier --only torch build): no finding.
    (tmp_path / "d").mkdir()
    tiny_wheel(tmp_path / "d", "torch", "2.13.0+cpu.kiln1")
    assert "torch-wheel" not in {f.check for f in preflight.preflight(plan, {"PATH": ""})}


def test_fix_hints_say_where_a_python_or_gcc_the_distribution_lacks_comes_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CUDA recipes want Python 3.12 and gcc 13, which Debian 12 does not package: on Debian 12 the hints say
    where they come from (pyenv, a distribution that has them, the devel image); on Ubuntu 24.04, which
    packages both, its apt-get (tests/test_distro.py goes through every distribution, Python and gcc)."""
    plan = make_plan(load_recipe(CU130), workdir=tmp_path / "w", dist=tmp_path / "d", resources=BIG)
    gcc12 = tmp_path / "bin" / "gcc"
    gcc12.parent.mkdir()
    gcc12.write_text('#!/bin/sh\ncase "$1" in -dumpfullversion) echo 12.2.0;; *) echo "gcc (Debian 12.2.0-14) 12.2.0"; '
                     'echo "Free Software Foundation";; esac\n')  # fmt: skip
    gcc12.chmod(0o755)
    env = {"PATH": str(gcc12.parent), "CC": str(gcc12)}
    devel = "torchkiln images --recipe torch-2.13-cu130-py312 --target devel"
    monkeypatch.setattr(distro, "OS_RELEASE", (OS_RELEASES / "debian-12",))
    found = {f.check: f for f in preflight.preflight(plan, env)}
    python_fix = found["python"].fix
    assert python_fix.startswith("Debian 12 (bookworm) packages Python 3.11 only, not 3.12; pyenv: ")
    assert "pyenv install 3.12" in python_fix and devel in python_fix and "apt-get" not in python_fix
    assert "torchkiln recipe new torch-2.13-cu130-py312 --python python3" in python_fix
    # build.gcc = 13 is what the build runs (CC=gcc-13): this host has no gcc-13
    assert found["cc"].found == "$CC=gcc-13, and no gcc-13 on PATH"
    assert "Debian 12 (bookworm) packages gcc 11 and 12 only, not 13" in found["cc"].fix
    assert "Ubuntu 24.04 (noble)" in found["cc"].fix and devel in found["cc"].fix
    monkeypatch.setattr(distro, "OS_RELEASE", (OS_RELEASES / "ubuntu-24.04",))
    found = {f.check: f for f in preflight.preflight(plan, env)}
    assert found["python"].fix.startswith(  # python3.12-venv is in universe, which a minimal root lacks
        "apt-get install software-properties-common, then add-apt-repository -y universe (python3.12-venv is "
        "in universe, which a minimal root does not enable: its sources list has noble main only), then "
        "apt-get install python3.12-venv python3.12-dev (Ubuntu 24.04 (noble)"
    )
    assert found["cc"].fix.startswith(
        "gcc 13 (build.gcc = 13: the build runs gcc-13 and g++-13): apt-get install"
    )


def test_fix_hints_for_python_3_14_are_true_on_debian_13_and_forky(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 44: the CPU recipe made for 3.14 on Debian 13 offered Debian's pyenv (2.5.4: no 3.14 definition)
    and the devel image (no base ships 3.14). Now: upstream's pyenv, saying why, and no devel image; on
    forky/sid, which packages 3.14, its apt-get."""
    monkeypatch.setattr(distro, "DEBIAN_PYENV_PROFILE", tmp_path / "no-profile")
    made = tmp_path / "py314.toml"
    made.write_text(CPU.read_text().replace('version = "3.11"', 'version = "3.14"', 1))
    plan = make_plan(load_recipe(made), workdir=tmp_path / "w", dist=tmp_path / "d", resources=BIG)
    monkeypatch.setattr(distro, "OS_RELEASE", (OS_RELEASES / "debian-13",))
    (fix,) = [f.fix for f in preflight.preflight(plan, {"PATH": ""}) if f.check == "python"]
    assert fix.startswith(
        "Debian 13 (trixie) packages Python 3.13 only, not 3.14; pyenv: install pyenv from upstream"
    )
    assert "Debian 13 (trixie)'s pyenv 2.5.4 has no definition of a Python 3.14 release" in fix
    assert "apt-get install pyenv" not in fix and "--target devel" not in fix
    monkeypatch.setattr(distro, "OS_RELEASE", (OS_RELEASES / "debian-forky",))
    (fix,) = [f.fix for f in preflight.preflight(plan, {"PATH": ""}) if f.check == "python"]
    assert fix.startswith("apt-get install python3.14-venv python3.14-dev (Debian forky/sid")


def test_readmes_test_packages_are_what_ci_installs() -> None:
    """README.md's apt-get line of the tests' system packages names exactly what .ci/run installs."""
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    line = re.search(r"apt-get install -y (git ccache redis-server[^`]*?)\n```", readme)
    installed = re.search(
        r"apt-get install -y -qq --no-install-recommends \\\n(.*?)>/dev/null", ci, re.DOTALL
    )
    assert line and installed
    words = {w for w in line.group(1).split() if w != "\\"}
    assert words == {w for w in installed.group(1).split() if w != "\\"}


def test_readmes_recipe_table_is_the_shipped_recipes() -> None:
    """README.md's table of shipped recipes has a row per recipe file, each with the file's torch release,
    Python, and accelerator (its CUDA, cuDNN and NCCL where it pins them; aarch64 named)."""
    text = (ROOT / "README.md").read_text()
    rows = re.findall(r"(?m)^\| `([\w.-]+)` \| ([0-9.]+) \| ([0-9.]+) \| ([^|]+) \|$", text)
    assert sorted(r[0] for r in rows) == shipped_names()
    for name, torch, python, accelerator in rows:
        recipe = load_recipe(ROOT / "recipes" / f"{name}.toml")
        assert (torch, python) == (str(recipe.torch.version), recipe.python), name
        acc = recipe.accelerator
        if acc.kind == "cpu":
            assert accelerator.startswith("CPU"), name
            continue
        assert f"CUDA {acc.cuda}" in accelerator and accelerator.startswith(
            "aarch64: " if recipe.build.platform == "aarch64" else "CUDA "
        ), name
        for pinned in (acc.cudnn, acc.nccl):
            assert pinned is None or str(pinned) in accelerator or "aarch64" in accelerator, (name, pinned)


def test_readmes_missing_torch_wheel_message_is_the_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """README.md quotes what the first build says when the torch download found nothing (the shell passes its
    pattern on as typed): the build's own words, before any step."""
    text = " ".join((ROOT / "README.md").read_text().split())
    quoted = re.search(r"before any step with `(--torch '[^`]*)` and what to do", text)
    assert quoted, "README.md quotes no message for a missing torch wheel"
    blocks = {b.name: b for b in readme_blocks()}
    pattern = re.search(r"--torch (\S+)", blocks["main-job"].commands)
    assert pattern
    monkeypatch.chdir(tmp_path)
    argv = ["build", str(ROOT / "recipes" / "torch-2.13-cpu-py311.toml"), "--only", "torchvision"]
    assert (
        main([*argv, "--torch", pattern.group(1), "--skip-postcheck", "--workdir", str(tmp_path / "w")]) == 2
    )
    said = " ".join(capsys.readouterr().err.split())
    assert quoted.group(1) in said, said


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED.items()))
def test_a_renamed_command_still_runs_and_says_its_new_name(
    old: str, new: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 48: a renamed command keeps its old spelling, which runs the new one and says so."""
    with pytest.raises(SystemExit) as raised:
        main([old, "--help"])
    assert raised.value.code == 0
    out, err = capsys.readouterr()
    assert f"'{old}' is deprecated: it is now 'torchkiln {new}'" in err
    assert f"torchkiln {new}" in out and old not in COMMANDS
