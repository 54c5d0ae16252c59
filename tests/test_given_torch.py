"""``--torch WHEEL|REQ`` with ``--only torchvision`` (issue 11): torchvision built against a torch the user
already has, checked to pair, used by the install step and the post-build check, recorded in the manifest."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kit import ROOT, realtrees
from kit.dists import tiny_wheel
from kit.imagekit import require
from packaging.version import Version

from torchkiln.cli import main
from torchkiln.errors import UsageError
from torchkiln.files.digests import file_sha256
from torchkiln.plan.given_torch import resolve_given_torch
from torchkiln.plan.jobs import GIB, Resources
from torchkiln.plan.make import make_plan
from torchkiln.recipe.loader import load_recipe

CPU = ROOT / "recipes" / "torch-2.13-cpu-py311.toml"
CU130 = ROOT / "recipes" / "torch-2.13-cu130-py312.toml"
BIG = Resources(cpus=8, memory_bytes=64 * GIB)
PYPI = "https://pypi.org/simple"


def test_a_wheel_is_installed_paired_and_recorded(tmp_path: Path) -> None:
    wheel = tiny_wheel(tmp_path, "torch", "2.13.0")
    recipe = load_recipe(CPU)
    given = resolve_given_torch(str(wheel), recipe, "torchvision")
    plan = make_plan(recipe, workdir=tmp_path / "w", only="torchvision", resources=BIG, torch=given)
    steps = {s.name: s for s in plan.steps}
    assert steps["torchvision:install-torch"].argv[-1] == str(wheel)
    assert plan.env_for("torchvision")["PYTORCH_VERSION"] == "2.13.0"  # the wheel's torch requirement
    check = steps["checks:import"].argv
    assert check[check.index("--with") + 1] == str(wheel)
    assert any(file_sha256(wheel) in note for note in plan.notes)


def only_index(
    monkeypatch: pytest.MonkeyPatch, *, find_links: Path | None = None, url: str | None = None
) -> None:
    """pip's index for this test alone: a directory of wheels, or an index URL (no pip.conf, no other)."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_FIND_LINKS", str(find_links) if find_links else "")
    if url is None:
        monkeypatch.setenv("PIP_NO_INDEX", "1")
    else:
        monkeypatch.delenv("PIP_NO_INDEX", raising=False)
        monkeypatch.setenv("PIP_INDEX_URL", url)
        monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)


def test_a_pinned_requirement_is_taken_from_the_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index is a directory holding a torch 2.13.0 that requires no CUDA runtime: pip would install that."""
    (tmp_path / "index").mkdir()
    tiny_wheel(tmp_path / "index", "torch", "2.13.0")
    only_index(monkeypatch, find_links=tmp_path / "index")
    given = resolve_given_torch("torch==2.13.0", load_recipe(CPU), "torchvision")
    assert given.install == "torch==2.13.0" and str(given.version) == "2.13.0"
    assert "pip chose torch 2.13.0 (torch-2.13.0-py3-none-any.whl), a cpu build" in given.note


@pytest.mark.parametrize(
    ("text", "only", "words"),
    [
        ("torch==2.12.0", "torchvision", "does not pair with the recipe's torchvision 0.28.0"),
        ("torch>=2.13", "torchvision", "pinned to one version"),
        ("numpy==2.0", "torchvision", "pinned to one version"),
        ("torch==2.13.0+cu130", "torchvision", "a cu130 build of torch for a cpu recipe"),
        ("torch==2.13.0", None, "only with --only torchvision"),
        ("/nonexistent/torch-2.13.0-cp311-cp311-linux_x86_64.whl", "torchvision", "no such file"),
        ("/x/notorch-1.0-py3-none-any.whl", "torchvision", "not a torch wheel"),
    ],
)
def test_unusable_torch_is_refused(text: str, only: str | None, words: str) -> None:
    with pytest.raises(UsageError, match="--torch") as info:
        resolve_given_torch(text, load_recipe(CPU), only)
    assert words in str(info.value)


# How a user writes a wheel that is not there: a path, and the README's pattern, which the shell passes on as
# it is when no file matches it (bash, dash: glob(7); `shopt -s nullglob` is not the default).
MISSING = [
    "wheels/torch-2.13.0+cpu-*.whl",
    "wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
    "torch-2.13.0+cpu-cp31?-*.whl",
    "wheels/torch-[0-9]*.whl",
    "wheels/*",
]


@pytest.mark.parametrize("typed", MISSING)
@pytest.mark.parametrize("shell", ["bash", "sh"])
def test_a_wheel_that_is_not_there_is_named_missing_with_what_to_do_instead(
    typed: str,
    shell: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 44: with PyTorch's CPU index unreachable the download leaves wheels/ empty, and the next command
    got the pattern itself and said "not a torch wheel file name". The argument is made by a real shell, as
    the user's command line makes it."""
    (tmp_path / "wheels").mkdir()
    monkeypatch.chdir(tmp_path)
    done = subprocess.run([shell, "-c", f'printf "%s" {typed}'], capture_output=True, text=True, check=True)
    given = done.stdout
    assert given == typed  # no file matched: the shell passed the pattern on
    argv = ["build", str(CPU), "--only", "torchvision", "--torch", given, "--workdir", str(tmp_path / "w")]
    assert main([*argv, "--source-dir", f"torchvision={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"--torch {given!r}: no such file"), err
    assert ("a pattern the shell passes on as it is" in err) == any(c in given for c in "*?[")
    assert "PyTorch's index (download.pytorch.org) cannot be reached" in err
    assert "a torch wheel file you have" in err and "PyPI's torch==2.13.0" in err
    assert "with a CUDA recipe (torch-2.13-cu130-py312)" in err  # a recipe that exists, by its name
    assert (ROOT / "recipes" / "torch-2.13-cu130-py312.toml").is_file()
    assert "not a torch wheel" not in err and not (tmp_path / "w").exists()


def pypi(monkeypatch: pytest.MonkeyPatch) -> None:
    """PyPI as a user's machine has it (pip reads the wheels' metadata there: nothing big is downloaded)."""
    only_index(monkeypatch, url=PYPI)
    try:
        urllib.request.urlopen(f"{PYPI}/torch/", timeout=30).close()  # noqa: S310 - fixed https URL
    except (urllib.error.URLError, OSError) as exc:
        require(False, f"PyPI is not reachable ({exc})")


@pytest.mark.integration  # asks PyPI (what pip would install is now found out, not assumed)
def test_upstreams_unlabelled_cuda_wheel_pairs_with_a_cuda_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    pypi(monkeypatch)  # where torch==2.13.0 is upstream's CUDA 13.0 build
    assert str(resolve_given_torch("torch==2.13.0", load_recipe(CU130), "torchvision").version) == "2.13.0"


def test_cli_plan_shows_the_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wheel = tiny_wheel(tmp_path, "torch", "2.13.0")
    args = [
        "plan",
        str(CPU),
        "--only",
        "torchvision",
        "--torch",
        str(wheel),
        "--workdir",
        str(tmp_path / "w"),
    ]
    assert main([*args, "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert notes and notes[0].startswith("--torch: torchvision built against torch 2.13.0")
    assert main(["plan", str(CPU), "--torch", str(wheel)]) == 2
    assert "only with --only torchvision" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------------
# What a given torch really is (issue 20 item 4): upstream's real wheels, pip's real resolution.
# --------------------------------------------------------------------------------------------------------


def cu130_wheel() -> Path:
    """Upstream's torch 2.13.0 for CPython 3.11 from PyPI: its CUDA 13.0 build (version 2.13.0, no label)."""
    return realtrees.pypi_wheel("torch===2.13.0", python_version="3.11")


def cpu_wheel() -> Path:
    """torch 2.13.0+cpu for CPython 3.11, from the configured index (PyTorch's CPU index, or a local copy)."""
    return realtrees.pypi_wheel("torch===2.13.0+cpu", python_version="3.11")


def with_python(path: Path, python: str):  # noqa: ANN201 - a Recipe
    return dataclasses.replace(load_recipe(path), python=python)


@pytest.mark.integration
def test_upstreams_cuda_wheel_file_is_refused_for_a_cpu_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    wheel = cu130_wheel()
    with pytest.raises(UsageError) as info:
        resolve_given_torch(str(wheel), load_recipe(CPU), "torchvision")
    message = str(info.value)
    assert message.startswith(f"--torch '{wheel}': the wheel {wheel.name} (torch 2.13.0): ")
    assert "a cu130 build of torch for a cpu recipe (its torch/version.py says cuda = '13.0')" in message
    assert "torch===2.13.0+cpu" in message and "\n" not in message
    # The same wheel suits a CUDA 13.0 recipe, and not one of another CUDA minor.
    cu130 = with_python(CU130, "3.11")
    assert str(resolve_given_torch(str(wheel), cu130, "torchvision").version) == "2.13.0"
    cu126 = dataclasses.replace(
        cu130, accelerator=dataclasses.replace(cu130.accelerator, cuda=Version("12.6"))
    )
    with pytest.raises(UsageError, match="a cu130 build of torch for a cu126 recipe"):
        resolve_given_torch(str(wheel), cu126, "torchvision")
    # The command line: one line, exit 2, nothing planned.
    assert main(["plan", str(CPU), "--only", "torchvision", "--torch", str(wheel)]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "a cu130 build of torch for a cpu recipe" in err and "Traceback" not in err
    )


@pytest.mark.integration
def test_a_requirement_is_what_the_index_gives_cuda_on_pypi(monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's machine: PyPI gives torch==2.13.0 as its CUDA 13.0 build. Refused for the CPU recipe before
    any step (the issue: it installed 9.6 GB of NVIDIA wheels and failed after the compile)."""
    pypi(monkeypatch)
    with pytest.raises(UsageError) as info:
        resolve_given_torch("torch==2.13.0", load_recipe(CPU), "torchvision")
    message = str(info.value)
    assert "pip would install torch 2.13.0 (torch-2.13.0-cp311-cp311-" in message, message
    assert "a cu130 build of torch for a cpu recipe (its METADATA requires cuda-toolkit==13.0.3)" in message


@pytest.mark.integration
def test_a_requirement_is_what_the_index_gives_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same ``torch==2.13.0`` against an index of upstream's real CPU wheel (this development machine's
    case) and against one of its real CUDA 13.0 wheel (a user's): each is read as what it is."""
    cpu_index, cuda_index = tmp_path / "cpu", tmp_path / "cuda"
    cpu_index.mkdir()
    cuda_index.mkdir()
    (cpu_index / cpu_wheel().name).symlink_to(cpu_wheel())
    (cuda_index / cu130_wheel().name).symlink_to(cu130_wheel())
    cpu, cu130 = load_recipe(CPU), with_python(CU130, "3.11")
    only_index(monkeypatch, find_links=cpu_index)
    given = resolve_given_torch("torch==2.13.0", cpu, "torchvision")
    assert "pip chose torch 2.13.0+cpu (torch-2.13.0+cpu-cp311-cp311-" in given.note, given.note
    with pytest.raises(
        UsageError, match=r"a cpu build of torch for a cu130 recipe \(its torch/version.py says cuda = None"
    ):
        resolve_given_torch("torch==2.13.0", cu130, "torchvision")
    only_index(monkeypatch, find_links=cuda_index)
    with pytest.raises(
        UsageError,
        match=r"a cu130 build of torch for a cpu recipe \(its torch/version.py says cuda = '13.0'\)",
    ):
        resolve_given_torch("torch==2.13.0", cpu, "torchvision")
    assert "a cu130 build" in resolve_given_torch("torch==2.13.0", cu130, "torchvision").note


def test_a_release_without_compatibility_data_is_said_to_be_one() -> None:
    """torch 2.6 is not refused as "does not pair": there is no data to tell; the message says which
    releases have data (read from the data, which grows)."""
    from torchkiln.recipe.compat import torch_release_range

    with pytest.raises(UsageError) as info:
        resolve_given_torch("torch==1.13.0", load_recipe(CPU), "torchvision")
    message = str(info.value)
    assert "there is no compatibility data for torch 1.13" in message and "does not pair" not in message
    assert f"(data/compat.toml has {torch_release_range()})" in message
