"""The configure watcher on real CMake summary text (tests/data/cmake_summaries)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from packaging.version import Version

from torchkiln.build.watch import Expectations, SummaryWatcher, parse_summary
from torchkiln.recipe.loader import load_recipe

ROOT = Path(__file__).resolve().parent.parent
SUMMARIES = Path(__file__).parent / "data" / "cmake_summaries"
CU130 = load_recipe(ROOT / "recipes" / "torch-2.13-cu130-py312.toml")
CPU = load_recipe(ROOT / "recipes" / "torch-2.13-cpu-py311.toml")


def watch(name: str, expect: Expectations) -> SummaryWatcher:
    watcher = SummaryWatcher(expect)
    results = [
        r for line in (SUMMARIES / name).read_text().splitlines() if (r := watcher.feed(line)) is not None
    ]
    assert len(results) == 1, "the verdict comes exactly once, when the summary block ends"
    return watcher


def test_parse_summary_reads_nested_keys() -> None:
    lines = (SUMMARIES / "cuda_on_no_cudnn_11.5.txt").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "Summary" in line)
    summary = parse_summary(lines[start + 1 :])
    assert summary["USE_CUDA"] == "ON" and summary["USE_CUDNN"] == "OFF"
    assert summary["CUDA version"] == "11.5" and summary["BLAS"] == "open"
    assert summary["C++ compiler version"] == "11.3.0"


def test_cuda_off_outcome_names_use_cuda_and_the_cause() -> None:
    expect = Expectations.for_step({"USE_CUDA": "1", "USE_CUDNN": "1", "USE_NCCL": "1", "BLAS": "MKL"}, CU130)
    watcher = watch("cuda_off_2.10.txt", expect)
    by_setting = {c.setting: c for c in watcher.contradictions or []}
    assert by_setting["USE_CUDA"].actual == "OFF" and by_setting["USE_CUDA"].expected == "ON"
    text = str(by_setting["USE_CUDA"])
    assert "nvcc is not on PATH" in text and "Could NOT find CUDA" in text
    assert "USE_NCCL" in by_setting and "USE_MKL" in by_setting
    # USE_CUDNN is only printed under USE_CUDA=ON: nothing to compare, no false report
    assert "USE_CUDNN" not in by_setting


def test_cpu_recipe_agrees_with_a_cpu_summary() -> None:
    env = {"USE_CUDA": "0", "USE_CUDNN": "0", "USE_NCCL": "0", "USE_DISTRIBUTED": "1", "BLAS": "OpenBLAS"}
    cpu_openblas = replace(CPU, blas=replace(CPU.blas, kind="openblas", mkl=None))
    watcher = watch("cuda_off_2.10.txt", Expectations.for_step(env, cpu_openblas))
    assert watcher.contradictions == []


def test_cudnn_missing_and_wrong_cuda_version() -> None:
    env = {"USE_CUDA": "1", "USE_CUDNN": "1", "USE_NCCL": "1"}
    watcher = watch("cuda_on_no_cudnn_11.5.txt", Expectations.for_step(env, CU130))
    by_setting = {c.setting: c for c in watcher.contradictions or []}
    assert set(by_setting) == {"USE_CUDNN", "CUDA version", "BLAS"}
    assert "Could NOT find CUDNN" in str(by_setting["USE_CUDNN"])
    assert by_setting["CUDA version"].expected == str(CU130.accelerator.cuda)
    assert by_setting["CUDA version"].actual == "11.5"
    assert CU130.accelerator.cuda == Version("13.0")


def test_output_that_ends_inside_the_summary_is_still_judged() -> None:
    watcher = SummaryWatcher(Expectations.for_step({"USE_CUDA": "1"}, CU130))
    for line in ("-- ******** Summary ********", "--   USE_CUDA              : OFF"):
        assert watcher.feed(line) is None
    verdict = watcher.close()
    assert verdict is not None and [c.setting for c in verdict] == ["USE_CUDA"]


def test_magma_missing_is_read_from_the_line_before_the_summary() -> None:
    """cmake/Summary.cmake prints no USE_MAGMA line: "MAGMA not found" earlier in the output is the evidence,
    however far before the summary it was printed."""
    env = {"USE_CUDA": "1", "USE_CUDNN": "1", "USE_MAGMA": "1"}
    lines = (SUMMARIES / "cuda_on_no_magma_11.5.txt").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if "Could not find hardware support for NEON" in line)
    lines[at:at] = [f"-- Performing Test FILLER_{i} - Success" for i in range(2000)]  # a long configure
    watcher = SummaryWatcher(Expectations.for_step(env, CU130))
    verdicts = [v for line in lines if (v := watcher.feed(line)) is not None]
    assert len(verdicts) == 1
    by_setting = {c.setting: c for c in verdicts[0]}
    magma = by_setting["USE_MAGMA"]
    assert (magma.expected, magma.actual) == ("ON", "OFF")
    assert magma.evidence == "-- MAGMA not found. Compiling without MAGMA support"
    assert "MAGMA_HOME" in str(magma) and "USE_CUDNN" in by_setting


def test_magma_not_asked_for_or_found_is_no_contradiction() -> None:
    off = watch(
        "cuda_on_no_magma_11.5.txt", Expectations.for_step({"USE_CUDA": "1", "USE_MAGMA": "0"}, CU130)
    )
    assert "USE_MAGMA" not in {c.setting for c in off.contradictions or []}
    found = watch(
        "cuda_on_no_cudnn_11.5.txt", Expectations.for_step({"USE_CUDA": "1", "USE_MAGMA": "1"}, CU130)
    )
    assert "USE_MAGMA" not in {c.setting for c in found.contradictions or []}
