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
from imagekit import require

from torchkiln.build import toolchain_records
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
