"""The tools a compile used, probed once per toolchain (issue 38): the same programs in another work directory
are read back, a changed program or build venv probes again, a wrapper script outside the build venv is
probed every time. Real compilers and a real venv's Python; the probing is counted by wrapping
:func:`torchkiln.host.toolchain.collect` (which still runs)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.imagekit import require

from torchkiln.build import toolchain_records
from torchkiln.build.envstore import clone_tree
from torchkiln.build.toolchain_records import remembered_toolchain
from torchkiln.plan.records import Records


@pytest.fixture(scope="module")
def build_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("toolchain") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return venv


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    calls: list[int] = []
    real = toolchain_records.collect

    def counting(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - collect's own
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(toolchain_records, "collect", counting)
    yield calls


def workdir_with(tmp_path: Path, name: str, venv: Path) -> tuple[Path, dict[str, str]]:
    """A work directory whose build venv (a clone of ``venv``'s files) comes first on PATH."""
    for tool in ("cc", "c++"):
        require(shutil.which(tool) is not None, f"{tool} is not installed")
    work = tmp_path / name
    shutil.copytree(venv, work / "venv", symlinks=True)
    return work, {"PATH": f"{work / 'venv' / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin"}


def test_the_same_toolchain_is_probed_once(tmp_path: Path, build_venv: Path, probes: list[int]) -> None:
    records = Records.for_build(tmp_path / "a", tmp_path / "store")
    work, env = workdir_with(tmp_path, "a", build_venv)
    python = work / "venv" / "bin" / "python"
    first = remembered_toolchain(env, python, records, workdir=work, cuda=False, cache_tool=None)
    assert len(probes) == 1 and {"gcc", "g++"} <= set(first.tools)
    assert remembered_toolchain(env, python, records, workdir=work, cuda=False, cache_tool=None) == first
    # another work directory of the machine: its venv's bin/ on PATH, the same programs
    other, other_env = workdir_with(tmp_path, "b", build_venv)
    elsewhere = Records.for_build(other, tmp_path / "store")
    again = remembered_toolchain(
        other_env, other / "venv" / "bin" / "python", elsewhere, workdir=other, cuda=False, cache_tool=None
    )
    assert len(probes) == 1 and again == first


def test_a_changed_program_or_venv_is_probed_again(
    tmp_path: Path, build_venv: Path, probes: list[int]
) -> None:
    records = Records.for_build(tmp_path / "a", None)
    work, env = workdir_with(tmp_path, "a", build_venv)
    python = work / "venv" / "bin" / "python"
    remembered_toolchain(env, python, records, workdir=work, cuda=False, cache_tool=None)
    changes = [
        {**env, "CC": str(Path(os.path.realpath(shutil.which("gcc") or "gcc")))},  # another file as $CC
        {**env, "LD_LIBRARY_PATH": "/nonexistent"},
    ]
    for changed in changes:
        before = len(probes)
        remembered_toolchain(changed, python, records, workdir=work, cuda=False, cache_tool=None)
        assert len(probes) == before + 1, changed
    # a package installed into the build venv (what the manifest's build_packages lists)
    site = next((work / "venv" / "lib").glob("python*/site-packages"))
    (site / "kiln_extra-1.0.dist-info").mkdir()
    before = len(probes)
    remembered_toolchain(env, python, records, workdir=work, cuda=False, cache_tool=None)
    assert len(probes) == before + 1


def test_a_wrapper_script_outside_the_venv_is_probed_every_time(
    tmp_path: Path, build_venv: Path, probes: list[int]
) -> None:
    records = Records.for_build(tmp_path / "a", None)
    work, env = workdir_with(tmp_path, "a", build_venv)
    wrapper = tmp_path / "bin" / "cxx"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("c++")} "$@"\n')
    wrapper.chmod(0o755)
    env = {**env, "CXX": str(wrapper)}
    python = work / "venv" / "bin" / "python"
    for _ in range(2):
        remembered_toolchain(env, python, records, workdir=work, cuda=False, cache_tool=None)
    assert len(probes) == 2


def _venv_with_programs(tmp_path: Path, build_venv: Path, name: str) -> Path:
    """A work directory whose build venv holds what pip's cmake and ninja put there: a script entry point
    (cmake) and a real ELF binary (ninja), both first on PATH."""
    for tool in ("cc", "c++", "cmake", "ninja"):
        require(shutil.which(tool) is not None, f"{tool} is not installed")
    work = tmp_path / name
    shutil.copytree(build_venv, work / "venv", symlinks=True)
    shutil.copy2(str(shutil.which("ninja")), work / "venv" / "bin" / "ninja")
    script = work / "venv" / "bin" / "cmake"
    script.write_text(f'#!/bin/sh\nexec {shutil.which("cmake")} "$@"\n')
    script.chmod(0o755)
    return work


def _env_of(work: Path) -> dict[str, str]:
    return {"PATH": f"{work / 'venv' / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin"}


# another work directory of the same machine, as a path may relate to the first one's (/t/a)
OTHER_WORKDIRS = {
    "a sibling": "b",
    "deeper": "x/y/b",
    "the first one's name extended": "a2",
    "inside the first one": "a/inner",
    "beside a directory named like the first one's path": "t/a",
}


@pytest.mark.parametrize("other_name", OTHER_WORKDIRS.values(), ids=OTHER_WORKDIRS.keys())
@pytest.mark.parametrize("through_symlink", [False, True], ids=["real path", "through a symlink"])
def test_a_venv_cloned_elsewhere_reads_back_what_probing_there_answers(
    tmp_path: Path, build_venv: Path, probes: list[int], other_name: str, through_symlink: bool
) -> None:
    """The class: a build venv cloned into another work directory (hard links, as the environment store
    clones: the same files) is the same toolchain, so it is not probed again, and the answer read back
    names the other work directory's programs, exactly what probing there finds (the oracle)."""
    store = tmp_path / "store"
    first = _venv_with_programs(tmp_path, build_venv, "a")
    python = first / "venv" / "bin" / "python"
    found = remembered_toolchain(
        _env_of(first), python, Records.for_build(first, store), workdir=first, cuda=False, cache_tool=None
    )
    assert found.tools["ninja"].path == str(first / "venv" / "bin" / "ninja")
    other = tmp_path / other_name
    other.mkdir(parents=True, exist_ok=True)
    clone_tree(first / "venv", other / "venv")
    if through_symlink:
        (tmp_path / "link").symlink_to(other)
        other = tmp_path / "link"
    env, other_python = _env_of(other), other / "venv" / "bin" / "python"
    before = len(probes)
    again = remembered_toolchain(
        env, other_python, Records.for_build(other, store), workdir=other, cuda=False, cache_tool=None
    )
    assert len(probes) == before, "the same programs in another work directory were probed again"
    assert again == toolchain_records.collect(env, other_python, cuda=False, cache_tool=None)
    assert again.tools["ninja"].path == str(other / "venv" / "bin" / "ninja")


def test_a_program_replaced_in_the_cloned_venv_is_probed_there(
    tmp_path: Path, build_venv: Path, probes: list[int]
) -> None:
    """Not the same files: a copy (another inode) of ninja in the other work directory's venv is probed."""
    store = tmp_path / "store"
    first = _venv_with_programs(tmp_path, build_venv, "a")
    remembered_toolchain(
        _env_of(first), first / "venv" / "bin" / "python", Records.for_build(first, store),
        workdir=first, cuda=False, cache_tool=None,
    )  # fmt: skip
    other = tmp_path / "b"
    clone_tree(first / "venv", other / "venv")
    ninja = other / "venv" / "bin" / "ninja"
    ninja.unlink()
    shutil.copy2(str(shutil.which("ninja")), ninja)
    before = len(probes)
    remembered_toolchain(
        _env_of(other), other / "venv" / "bin" / "python", Records.for_build(other, store),
        workdir=other, cuda=False, cache_tool=None,
    )  # fmt: skip
    assert len(probes) == before + 1
