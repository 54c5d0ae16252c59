"""cuDNN's and NCCL's rules for running with another release than the compiled one (recipe/libcompat.py), as
the recipe's rules and verify's checks apply them. Generated versions against the rule's statement (NVIDIA's
cuDNN API Compatibility: same major, runtime minor >= compiled minor, patches either way)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import tomli_w
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.version import Version
from test_describe import facts

from torchkiln.errors import RecipeError
from torchkiln.recipe import libcompat
from torchkiln.recipe.loader import load_recipe
from torchkiln.verify import buildconfig

RELEASES = st.tuples(st.integers(7, 10), st.integers(0, 30), st.integers(0, 9))


def dotted(parts: tuple[int, ...]) -> str:
    return ".".join(map(str, parts))


@settings(deadline=None)  # the machine is shared: timings vary
@given(RELEASES, RELEASES)
def test_cudnn_rule(compiled: tuple[int, int, int], runtime: tuple[int, int, int]) -> None:
    ok = runtime[0] == compiled[0] and runtime[1] >= compiled[1]
    problem = libcompat.cudnn_problem(Version(dotted(compiled)), Version(dotted(runtime)))
    assert (problem is None) == ok, (compiled, runtime, problem)


@settings(deadline=None)  # the machine is shared: timings vary
@given(RELEASES, RELEASES)
def test_nccl_rule(compiled: tuple[int, int, int], runtime: tuple[int, int, int]) -> None:
    ok = runtime[0] == compiled[0] and runtime >= compiled
    assert (libcompat.nccl_problem(Version(dotted(compiled)), Version(dotted(runtime))) is None) == ok


@settings(deadline=None)  # the machine is shared: timings vary
@given(RELEASES, RELEASES)
def test_verify_applies_the_rule_to_what_torch_loads(compiled: tuple, runtime: tuple) -> None:
    """The self-checks on an installation: the loaded cuDNN against the compiled one, and its package."""
    found = facts(
        cudnn_compile=compiled,
        cudnn_runtime=runtime,
        nvidia_dists={"nvidia-cudnn-cu12": f"{dotted(runtime)}.7", "nvidia-nccl-cu12": "2.27.3"},
    )
    checks = buildconfig.self_checks(found)
    ok = libcompat.cudnn_problem(Version(dotted(compiled)), Version(dotted(runtime))) is None
    assert checks["cudnn_runtime"].status == ("pass" if ok else "fail"), checks["cudnn_runtime"]
    assert checks["nvidia_packages"].status == ("pass" if ok else "fail"), checks["nvidia_packages"]


def test_a_package_that_is_not_the_loaded_library_fails() -> None:
    found = facts(nvidia_dists={"nvidia-cudnn-cu12": "9.11.0.98", "nvidia-nccl-cu12": "2.27.3"})
    check = buildconfig.self_checks(found)["nvidia_packages"]
    assert check.status == "fail" and "is not the cudnn torch loads (9.10.2" in check.message


def test_nccl_runtime_newer_than_compiled_passes_older_fails() -> None:
    newer = facts(
        nccl_runtime=(2, 28, 3), nvidia_dists={"nvidia-cudnn-cu12": "9.10.2.21", "nvidia-nccl-cu12": "2.28.3"}
    )
    assert buildconfig.self_checks(newer)["nvidia_packages"].status == "pass"
    older = dataclasses.replace(
        newer, nccl_runtime=(2, 26, 3), nvidia_dists={**newer.nvidia_dists, "nvidia-nccl-cu12": "2.26.3"}
    )
    check = buildconfig.self_checks(older)["nvidia_packages"]
    assert check.status == "fail" and "NCCL 2.26.3 is older than the compiled 2.27.3" in check.message


BASE = {
    "recipe": {"name": "r"},
    "torch": {"ref": "v2.8.0", "version": "2.8.0"},
    "torchvision": {"ref": "v0.23.0", "version": "0.23.0"},
    "python": {"version": "3.11"},
    "accelerator": {"kind": "cuda", "cuda": "12.8", "arch_list": ["8.0", "9.0"], "cudnn": "9.8.0", "nccl": "2.27.3"},
    "blas": {"kind": "mkl", "mkl": "2024.2.0"},
}  # fmt: skip


def write(tmp_path: Path, **accelerator: str) -> Path:
    doc = {**BASE, "accelerator": {**BASE["accelerator"], **accelerator}}
    path = tmp_path / "r.toml"
    path.write_text(tomli_w.dumps(doc))
    return path


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"cudnn_runtime": "9.10.2.21"}, None),  # upstream's 2.8.0
        ({"cudnn_runtime": "9.8.1"}, None),  # a patch either way
        (
            {"cudnn_runtime": "9.7.1.26"},
            "accelerator.cudnn_runtime: cuDNN 9.7.1.26 is older than the compiled 9.8.0",
        ),
        ({"cudnn_runtime": "10.0.0"}, "accelerator.cudnn_runtime: cuDNN 10.0.0 is another major"),
        ({"nccl_runtime": "2.28.3"}, None),
        (
            {"nccl_runtime": "2.27.1"},
            "accelerator.nccl_runtime: NCCL 2.27.1 is older than the compiled 2.27.3",
        ),
        ({"cudnn_runtime": "x"}, "accelerator.cudnn_runtime: malformed version"),
    ],
)
def test_the_recipe_rule(tmp_path: Path, fields: dict[str, str], problem: str | None) -> None:
    path = write(tmp_path, **fields)
    if problem is None:
        recipe = load_recipe(path)
        assert recipe.accelerator.cudnn_shipped == Version(fields.get("cudnn_runtime", "9.8.0"))
        return
    with pytest.raises(RecipeError) as raised:
        load_recipe(path)
    assert any(problem in str(p) for p in raised.value.problems), raised.value.problems


def test_a_cpu_recipe_names_no_runtime_library(tmp_path: Path) -> None:
    doc = {**BASE, "accelerator": {"kind": "cpu", "cudnn_runtime": "9.10.2"}}
    path = tmp_path / "r.toml"
    path.write_text(tomli_w.dumps(doc))
    with pytest.raises(
        RecipeError, match='accelerator.cudnn_runtime: only valid with accelerator.kind = "cuda"'
    ):
        load_recipe(path)
