"""The check venv cloned while the compile runs (issue 38, torchkiln.build.warmcheck): taken by checks:venv only
when it is whole and a clone of the build venv as that venv is now. Real venvs (this Python's ``venv``), real
threads, real ``cp --link`` clones; a directory stands in for the environment store's entry."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from torchkiln.build import checkvenv
from torchkiln.build.envstore import clone_tree, relocate_venv
from torchkiln.build.warmcheck import MARK, Warming, take, warm_path
from torchkiln.plan.model import Step

pytestmark = pytest.mark.integration  # real venvs with pip, clones of them


@pytest.fixture(scope="module")
def entry(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A store entry's venv, kept from another work directory's path (its scripts name that path)."""
    root = tmp_path_factory.mktemp("store")
    kept_from = root / "old-work" / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(kept_from)], check=True)
    (kept_from / "bin" / "tool").write_text(f"#!{kept_from}/bin/python\nprint('tool')\n")
    (kept_from / "bin" / "tool").chmod(0o755)
    entry_venv = root / "entry" / "venv"
    clone_tree(kept_from, entry_venv)
    return entry_venv, str(kept_from)


def work(tmp_path: Path, entry: tuple[Path, str]) -> tuple[Path, Path, Step]:
    """A work directory whose build venv was cloned from the entry, and its checks:venv step."""
    build_venv, check_venv = tmp_path / "work" / "venv", tmp_path / "work" / "check-venv"
    clone_tree(entry[0], build_venv)
    relocate_venv(build_venv, entry[1], str(build_venv))
    step = Step("checks:venv", "checks", "", ("true",), venv=str(check_venv), clones=str(build_venv))
    return build_venv, check_venv, step


def prefix(python: Path) -> str:
    done = subprocess.run([python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True)
    return done.stdout.strip()


def test_a_warm_clone_is_the_check_venv_relocated_to_its_path(tmp_path: Path, entry) -> None:
    build_venv, check_venv, step = work(tmp_path, entry)
    warming = Warming()
    warming.cloned(str(build_venv), *entry)
    warming.start([step, Step("torchvision:wheel", "compile", "torchvision", ("true",))])
    warming.join(step.venv)
    warm = warm_path(check_venv)
    assert (warm / MARK).read_text() == str(build_venv)
    assert take(warm, build_venv, check_venv) and not warm.exists()
    assert not (check_venv / MARK).exists()
    assert (check_venv / "bin" / "tool").read_text().startswith(f"#!{check_venv}/bin/python\n")
    assert prefix(check_venv / "bin" / "python") == str(check_venv)
    warming.finish()
    assert check_venv.is_dir(), "what was taken stays"


def test_a_venv_changed_after_its_clone_from_the_store_drops_its_warm_clone(tmp_path: Path, entry) -> None:
    """A whole build's torch compile warms the check venv; install-torch then puts that torch into the build
    venv: the warm clone, of the venv before, must not be taken."""
    build_venv, check_venv, step = work(tmp_path, entry)
    warming = Warming()
    warming.cloned(str(build_venv), *entry)
    warming.start([step])
    warming.changed(str(build_venv))
    assert not warm_path(check_venv).exists()
    warming.start([step])
    assert not warming.threads, "no origin any more: nothing warmed"


@pytest.mark.parametrize("damage", ["no mark", "another venv's mark", "no clone"])
def test_a_warm_clone_that_is_not_whole_or_not_of_this_venv_is_not_taken(
    tmp_path: Path, entry, damage: str
) -> None:
    build_venv, check_venv, _ = work(tmp_path, entry)
    warm = warm_path(check_venv)
    if damage != "no clone":
        clone_tree(entry[0], warm)
    if damage == "another venv's mark":
        (warm / MARK).write_text(str(tmp_path / "other" / "venv"))
    assert not take(warm, build_venv, check_venv)
    assert not warm.exists() and not check_venv.exists()


def test_a_warm_clone_no_step_takes_is_removed(tmp_path: Path, entry) -> None:
    build_venv, check_venv, step = work(tmp_path, entry)
    warming = Warming()
    warming.cloned(str(build_venv), *entry)
    warming.start([step])
    warming.drop(step.venv)  # checks:venv reused from the store
    warming.finish()
    assert not warm_path(check_venv).exists() and not warming.threads


def test_checkvenv_takes_the_warm_clone_and_prunes_it(tmp_path: Path, entry) -> None:
    build_venv, check_venv, step = work(tmp_path, entry)
    warming = Warming()
    warming.cloned(str(build_venv), *entry)
    warming.start([step])
    warming.join(step.venv)
    argv = ["--from", str(build_venv), "--python", "python3", "--keep=torch"]
    assert checkvenv.main([*argv, "--warm", str(warm_path(check_venv)), "--", str(check_venv)]) == 0
    assert not warm_path(check_venv).exists()
    assert prefix(check_venv / "bin" / "python") == str(check_venv)
    assert (check_venv / "bin" / "tool").read_text().startswith(f"#!{check_venv}/bin/python\n")
