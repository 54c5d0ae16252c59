"""The configure watcher on whole configure logs in upstream's order (tests/data/cmake_summaries, README.md
there says how each was made): ONNX's summary block first, then the MAGMA search, then PyTorch's summary."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from kit import ROOT
from packaging.version import Version

from torchkiln.build.watch import Contradiction, Expectations, Messages, SummaryWatcher, parse_summary
from torchkiln.plan.make import make_plan
from torchkiln.recipe.loader import load_recipe
from torchkiln.recipe.model import Recipe

LOGS = ROOT / "tests" / "data" / "cmake_summaries"
CU130 = load_recipe(ROOT / "recipes" / "torch-2.13-cu130-py312.toml")
CPU = load_recipe(ROOT / "recipes" / "torch-2.13-cpu-py311.toml")
# What [build.flags] adds for the CUDA libraries no shipped recipe asks for by default.
CUDA_LIBRARIES = {"USE_CUSPARSELT": "1", "USE_CUDSS": "1"}


def recipe_env(recipe: Recipe) -> dict[str, str]:
    """The variables torch:wheel runs with for ``recipe`` (the plan's own, as the build sets them)."""
    with tempfile.TemporaryDirectory() as tmp:
        plan = make_plan(recipe, workdir=Path(tmp) / "work", dist=Path(tmp) / "dist", only="torch")
        return dict(plan.env_for("torch"))


def cuda_recipe(release: str) -> Recipe:
    """The cu130 recipe, with the CUDA release the log's toolkit has (12.4 for the 2.6.0 logs)."""
    return replace(CU130, accelerator=replace(CU130.accelerator, cuda=Version(release)))


def long_configure(name: str) -> list[str]:
    """A log with 2000 more lines before ONNX's block, as a real configure prints between the dependency
    messages of cmake/Dependencies.cmake and the summary (the dependencies' own checks)."""
    lines = (LOGS / name).read_text().splitlines()
    at = lines.index("-- ******** Summary ********") - 1
    return lines[:at] + [f"-- Performing Test FILLER_{i} - Success" for i in range(2000)] + lines[at:]


def verdict(name: str, env: dict[str, str], recipe: Recipe) -> dict[str, Contradiction]:
    watcher = SummaryWatcher(Expectations.for_step(env, recipe))
    results = [r for line in long_configure(name) if (r := watcher.feed(line)) is not None]
    assert len(results) == 1, "the verdict comes exactly once, when PyTorch's summary ends"
    assert watcher.summary is not None and watcher.summary["TORCH_VERSION"] in name
    assert [s["ONNX version"] for s in watcher.other_summaries] != [], "ONNX's block came first, set aside"
    return {c.setting: c for c in results[0]}


def test_the_logs_are_in_upstreams_order() -> None:
    """Each log holds ONNX's summary, then the MAGMA search, then PyTorch's summary, then CMake's end."""
    for log in sorted(LOGS.glob("pytorch-*.log")):
        lines = log.read_text().splitlines()
        starts = [i for i, line in enumerate(lines) if line == "-- ******** Summary ********"]
        magma = [i for i, line in enumerate(lines) if "MAGMA" in line and "Summary" not in line]
        assert len(starts) == 2 and "ONNX version" in "\n".join(lines[starts[0] : starts[1]]), log.name
        assert starts[0] < min(magma) < starts[1], log.name
        assert lines[-3:-1] == ["-- Configuring done", "-- Generating done"], log.name


@pytest.mark.parametrize(
    ("log", "release"),
    [
        ("pytorch-2.6.0-cuda-without-libraries.log", "12.4"),
        ("pytorch-2.13.0-cuda-without-libraries.log", "13.0"),
    ],
)
def test_cuda_libraries_missing_are_caught_past_onnxs_summary(log: str, release: str) -> None:
    """cuDNN, cuSPARSELt, cuDSS and MAGMA came out off while CUDA, NCCL and MKL were found: each is named
    with the warning CMake printed (two spaces after its full stop, put back together), however long the
    configure went on after it."""
    recipe = cuda_recipe(release)
    found = verdict(log, {**recipe_env(recipe), **CUDA_LIBRARIES}, recipe)
    assert set(found) == {"USE_CUDNN", "USE_CUSPARSELT", "USE_CUDSS", "USE_MAGMA"}
    assert all((c.expected, c.actual) == ("ON", "OFF") for c in found.values())
    assert found["USE_CUDNN"].evidence == "Cannot find cuDNN library. Turning the option off"
    assert found["USE_CUSPARSELT"].evidence == "Cannot find cuSPARSELt library. Turning the option off"
    assert found["USE_CUDSS"].evidence == "Cannot find CUDSS library. Turning the option off"
    assert found["USE_MAGMA"].evidence == "MAGMA not found. Compiling without MAGMA support"
    assert "MAGMA_HOME" in str(found["USE_MAGMA"]) and "CUDNN_INCLUDE_DIR" in str(found["USE_CUDNN"])


def test_no_cuda_and_no_mkl_are_caught() -> None:
    """No CUDA toolkit (and no MKL): USE_CUDA, NCCL, MKL and MAGMA all came out off."""
    recipe = cuda_recipe("12.4")
    found = verdict("pytorch-2.6.0-no-cuda-no-mkl.log", recipe_env(recipe), recipe)
    assert set(found) == {"USE_CUDA", "USE_NCCL", "USE_MKL", "USE_MAGMA"}  # no BLAS line: USE_BLAS 0
    assert found["USE_CUDA"].evidence.startswith("PyTorch: CUDA cannot be found. Depending on whether")
    assert "nvcc is not on PATH" in found["USE_CUDA"].cause
    assert found["USE_NCCL"].cause == "NCCL needs CUDA, and CUDA came out off"
    assert "MKL could not be found. Defaulting to Eigen" in str(found["USE_MKL"])
    assert (
        found["USE_MAGMA"].evidence == "Not compiling with MAGMA. Suppress this warning with -DUSE_MAGMA=OFF."
    )
    # cuDNN is only printed under USE_CUDA=ON and no message turned it off: nothing to compare, no report
    assert "USE_CUDNN" not in found


@pytest.mark.parametrize(
    ("log", "release"), [("pytorch-2.6.0-all-found.log", "12.4"), ("pytorch-2.13.0-all-found.log", "13.0")]
)
def test_a_configure_that_found_everything_gives_no_alarm(log: str, release: str) -> None:
    recipe = cuda_recipe(release)
    assert verdict(log, {**recipe_env(recipe), **CUDA_LIBRARIES}, recipe) == {}


def test_a_cpu_recipe_agrees_with_a_configure_without_cuda() -> None:
    env = recipe_env(CPU)
    assert env["USE_CUDA"] == "0"
    cpu_eigen = replace(CPU, blas=replace(CPU.blas, kind="eigen", mkl=None))
    env = {**env, "BLAS": "Eigen"}
    assert verdict("pytorch-2.6.0-no-cuda-no-mkl.log", env, cpu_eigen) == {}


def test_only_pytorchs_block_is_judged() -> None:
    """The first block is ONNX's: read as PyTorch's it would say nothing against any recipe."""
    lines = (LOGS / "pytorch-2.6.0-cuda-without-libraries.log").read_text().splitlines()
    start = lines.index("-- ******** Summary ********")
    onnx = parse_summary(lines[start + 1 : start + 40])
    assert "ONNX version" in onnx and "USE_CUDA" not in onnx and "TORCH_VERSION" not in onnx


def test_a_cuda_version_other_than_the_recipes_is_named() -> None:
    found = verdict("pytorch-2.6.0-all-found.log", recipe_env(CU130), CU130)
    assert set(found) == {"CUDA version"}
    assert (found["CUDA version"].expected, found["CUDA version"].actual) == ("13.0", "12.4")


def test_output_that_ends_inside_the_summary_is_still_judged() -> None:
    lines = (LOGS / "pytorch-2.6.0-no-cuda-no-mkl.log").read_text().splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith("--   USE_CUDA  "))
    watcher = SummaryWatcher(Expectations.for_step({"USE_CUDA": "1"}, CU130))
    assert all(watcher.feed(line) is None for line in lines[: end + 1])
    verdict = watcher.close()
    assert verdict is not None and [c.setting for c in verdict] == ["USE_CUDA"]


def test_a_configure_that_stops_before_the_summary_still_reports_what_it_turned_off() -> None:
    """Output that never reaches PyTorch's summary (configure failed later): the off-messages are the
    evidence, however far back they were printed."""
    lines = (LOGS / "pytorch-2.6.0-cuda-without-libraries.log").read_text().splitlines()
    onnx = lines.index("-- ******** Summary ********")
    filler = [f"-- Performing Test FILLER_{i} - Success" for i in range(2000)]  # a long configure
    watcher = SummaryWatcher(
        Expectations.for_step({"USE_CUDA": "1", "USE_CUDNN": "1", "USE_NCCL": "1"}, CU130)
    )
    assert all(watcher.feed(line) is None for line in lines[:onnx] + filler)
    verdict = watcher.close()
    assert verdict is not None and [c.setting for c in verdict] == ["USE_CUDNN"]


def test_messages_put_cmakes_wrapped_warnings_back_together() -> None:
    lines = (LOGS / "pytorch-2.6.0-no-cuda-no-mkl.log").read_text().splitlines()
    reader = Messages()
    messages = [m for line in lines for m in reader.feed(line)] + list(reader.close())
    assert (
        "PyTorch: CUDA cannot be found. Depending on whether you are building PyTorch or a PyTorch dependent "
        "library, the next warning / error will give you more info."
    ) in messages
    assert "cmake/Dependencies.cmake:44 (include)" not in messages, "the call stack is not a message"
