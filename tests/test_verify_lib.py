"""The verification suite's pure-Python core: build-settings parsing, recipe comparison, arch coverage,
the report writer and the nox install helper. The GPU-side comparisons are exercised with build facts a
CUDA build would report, so a mismatch in them is caught without a GPU."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
import zipfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kit import ROOT
from kit.imagekit import need_torch

from torchkiln.nox_support import find_wheels, install_for_verify, verify_args, wheel_requirements
from torchkiln.recipe import archs
from torchkiln.recipe.loader import load_recipe, parse_recipe
from torchkiln.recipe.model import Recipe
from torchkiln.verify import buildconfig, buildconfig_torchvision, proc, report
from torchkiln.verify import facts as facts_mod
from torchkiln.verify.comparison import Comparison, flag

CU130 = ROOT / "recipes" / "torch-2.13-cu130-py312.toml"
CPU = ROOT / "recipes" / "torch-2.13-cpu-py311.toml"
REFERENCE_RECIPES = ROOT / "tests" / "reference" / "recipes"

# --- Build settings parsing ----------------------------------------------------------------------------

REAL_SHAPED = (
    "PyTorch built with:\n  - GCC 13.3\n  - CuDNN 92.0  (built against CUDA 13.0)\n"
    "  - Build settings: BLAS_INFO=mkl, BUILD_TYPE=Release, COMMIT_SHA=abc123, CUDA_FLAGS= -Xfatbin "
    "-gencode arch=compute_75,code=sm_75 --diag_suppress=cc_clobber_ignored,--diag_suppress=field_without_dll, "
    "CUDA_VERSION=13.0, CUDNN_VERSION=9.20.0, CXX_FLAGS= -O2 -fPIC, TORCH_VERSION=2.13.0, USE_CUDA=ON, "
    "USE_CUDNN=ON, USE_NCCL=1, \n"
)


def test_parse_build_settings_keeps_values_with_commas() -> None:
    settings = buildconfig.parse_build_settings(REAL_SHAPED)
    assert settings["CUDA_FLAGS"].endswith(
        "--diag_suppress=cc_clobber_ignored,--diag_suppress=field_without_dll"
    )
    assert "arch=compute_75,code=sm_75" in settings["CUDA_FLAGS"]
    assert (settings["CUDNN_VERSION"], settings["USE_NCCL"], settings["USE_CUDA"]) == ("9.20.0", "1", "ON")
    assert list(settings) == sorted(settings)


def test_parse_build_settings_of_the_installed_torch() -> None:
    torch = need_torch()
    settings = buildconfig.parse_build_settings(torch.__config__.show())
    assert settings["TORCH_VERSION"] == torch.__version__.split("+")[0]
    assert flag(settings["USE_CUDA"]) is (torch.version.cuda is not None)


SHOWN = ROOT / "tests" / "data" / "torch_config_show"  # whole show() outputs of real wheels (README.md)


def test_gencode_archs_are_the_builds_own_arch_list() -> None:
    """upstream's 2.12.1+cu130: the -gencode flags of CUDA_FLAGS name exactly what its
    torch._C._cuda_getArchFlags() reports ('sm_75 ... sm_120'), while get_arch_list() is [] without a GPU."""
    settings = buildconfig.parse_build_settings((SHOWN / "2.12.1+cu130.txt").read_text())
    assert facts_mod.gencode_archs(settings["CUDA_FLAGS"]) == tuple(
        "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120".split()
    )
    cpu = buildconfig.parse_build_settings((SHOWN / "2.13.0+cpu.txt").read_text())
    assert facts_mod.gencode_archs(cpu["CUDA_FLAGS"]) == ()


def test_compiled_arch_list_of_the_installed_torch() -> None:
    """No device is asked: a CUDA build gives its recorded list, a CPU build (no _cuda_getArchFlags, no
    -gencode) an empty one."""
    torch = need_torch()
    settings = buildconfig.parse_build_settings(torch.__config__.show())
    archs_found, source = facts_mod.compiled_arch_list(torch, settings)
    if torch.version.cuda is None:
        assert (archs_found, source) == ((), "the -gencode flags of Build settings CUDA_FLAGS")
    else:
        assert source == "torch._C._cuda_getArchFlags()"
        assert archs_found and set(archs_found) >= set(facts_mod.gencode_archs(settings["CUDA_FLAGS"]))


def test_parse_build_settings_rejects_other_text() -> None:
    with pytest.raises(ValueError, match="no '- Build settings:' line"):
        buildconfig.parse_build_settings("PyTorch built with:\n  - GCC 13.3\n")


KEYS = st.from_regex(r"[A-Z][A-Z0-9_]{0,15}", fullmatch=True)
# Values as PyTorch prints them: anything on one line, never empty (empty values are omitted), and never
# containing ", KEY=" (that is the separator).
VALUES = st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=40).filter(
    lambda v: re.search(r", [A-Z][A-Z0-9_]*=", v) is None and v.strip() == v and not v.endswith(",")
)


@given(st.dictionaries(KEYS, VALUES, min_size=1, max_size=12))
def test_parse_build_settings_round_trip(settings: dict[str, str]) -> None:
    line = "".join(f"{k}={v}, " for k, v in sorted(settings.items()))
    shown = f"PyTorch built with:\n  - GCC 12.2\n  - Build settings: {line}\n"
    assert buildconfig.parse_build_settings(shown) == settings


@pytest.mark.parametrize(
    ("text", "value"),
    [("ON", True), ("1", True), ("True", True), ("OFF", False), ("0", False), ("false", False), (None, None)],
)
def test_flag_spellings(text: str | None, value: bool | None) -> None:
    assert flag(text) is value


def test_flag_rejects_non_boolean() -> None:
    with pytest.raises(ValueError, match="not a boolean"):
        flag("maybe")


@pytest.mark.parametrize(
    ("raw", "parts"), [(91002, (9, 10, 2)), (92000, (9, 20, 0)), (8907, (8, 9, 7)), (None, None)]
)
def test_decode_cudnn(raw: int | None, parts: tuple | None) -> None:
    assert buildconfig.decode_cudnn(raw) == parts


# --- Arch coverage ---------------------------------------------------------------------------------------


def test_expected_arch_list_from_recipe_entries() -> None:
    assert archs.expected_arch_list(["7.5", "9.0a", "12.0+PTX"]) == {
        "sm_75",
        "sm_90a",
        "sm_120",
        "compute_120",
    }
    with pytest.raises(ValueError, match="not like"):
        archs.expected_arch_list(["sm_80"])


@pytest.mark.parametrize(
    ("arch", "capability", "runs"),
    [
        ("sm_80", (8, 0), True),
        ("sm_80", (8, 6), True),
        ("sm_86", (8, 0), False),
        ("sm_80", (9, 0), False),
        ("sm_90a", (9, 0), True),
        ("sm_90a", (9, 1), False),
        ("compute_80", (12, 0), True),
        ("compute_120", (10, 0), False),
        ("sm_100f", (10, 3), True),
        ("sm_120", (12, 1), True),
    ],
)
def test_runs_on(arch: str, capability: tuple[int, int], runs: bool) -> None:
    assert archs.runs_on(arch, capability) is runs


def test_covering_finds_the_missing_kernel_image() -> None:
    cu130 = archs.expected_arch_list(load_recipe(CU130).accelerator.arch_list)
    assert archs.covering(sorted(cu130), (8, 9)) == ["sm_80", "sm_86"]
    assert archs.covering(sorted(cu130), (12, 1)) == ["sm_120"]
    # PTX (compute_120) is JIT-compiled for any newer device; cubins only run within their major.
    assert archs.covering(sorted(cu130 | {"compute_120"}), (13, 0)) == ["compute_120"]
    assert archs.covering(["sm_80", "sm_90"], (7, 5)) == []  # "no kernel image is available"
    with pytest.raises(ValueError, match="not a compiled architecture"):
        archs.parse_compiled("8.0")


# --- Recipe comparison, CUDA side, with the facts a CUDA build reports ----------------------------------


def cuda_facts(**changes: object) -> buildconfig.BuildFacts:
    """What a correct build of recipes/torch-2.13-cu130-py312.toml reports."""
    facts = buildconfig.BuildFacts(
        torch_version="2.13.0+cu130.kiln1",
        git_version="0" * 40,
        settings={
            "BLAS_INFO": "mkl",
            "BUILD_TYPE": "Release",
            "COMMIT_SHA": "0" * 40,
            "CUDA_VERSION": "13.0",
            "CUDNN_VERSION": "9.20.0",
            "TORCH_VERSION": "2.13.0",
            "USE_CUDA": "ON",
            "USE_CUDNN": "ON",
            "USE_NCCL": "1",
        },
        cuda_version="13.0",
        cuda_built=True,
        cudnn_available=True,
        cudnn_compile=(9, 20, 0),
        cudnn_runtime=(9, 20, 0),
        cudnn_error=None,
        nccl_available=True,
        nccl_version=(2, 29, 7),
        mkl_available=True,
        openmp_available=True,
        has_magma=True,
        arch_list=("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"),
        cxx11_abi=True,
        python_version="3.12",
        machine="x86_64",
        wheel_tags=("cp312-cp312-linux_x86_64",),
        compiler="GCC 13.3",
        mkl_version="2024.2",
        nvidia_dists={"nvidia-cudnn-cu13": "9.20.0.48", "nvidia-nccl-cu13": "2.29.7"},
        libraries_read=True,  # as upstream's 2.13.0+cu130 wheel links them (torchkiln.verify.linkage)
        nccl_needed="libnccl.so.2",
        nccl_path="/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2",
        magma_linkage="static in torch/lib/libtorch_cuda_linalg.so",
    )
    return dataclasses.replace(facts, **changes)


def statuses(checks: dict[str, Comparison]) -> dict[str, str]:
    return {k: c.status for k, c in checks.items()}


def test_matching_cuda_build_passes_every_check() -> None:
    recipe = load_recipe(CU130)
    recipe_results = buildconfig.recipe_checks(recipe, cuda_facts())
    assert set(recipe_results) == set(buildconfig.RECIPE_CHECKS)
    assert statuses(recipe_results) == {k: "pass" for k in buildconfig.RECIPE_CHECKS} | {"flags": "skip"}
    self_results = buildconfig.self_checks(cuda_facts())
    assert set(self_results) == set(buildconfig.SELF_CHECKS)
    assert {k for k, s in statuses(self_results).items() if s != "pass"} == set()


@pytest.mark.parametrize(
    ("changes", "check", "needle"),
    [
        (
            {"arch_list": ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100")},
            "arch_list",
            "accelerator.arch_list: torch._C._cuda_getArchFlags() vs TORCH_CUDA_ARCH_LIST (missing ['sm_120']",
        ),
        (
            {"arch_list": ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120")},
            "arch_list",
            "unexpected ['compute_120']",
        ),
        ({"cudnn_compile": (9, 10, 2)}, "cudnn", "accelerator.cudnn: cuDNN compile version"),
        ({"cudnn_compile": (9, 10, 2)}, "cudnn", "expected 9.20.0, actual 9.10.2"),
        (
            {"nvidia_dists": {"nvidia-cudnn-cu13": "9.20.0.47"}},
            "cudnn_runtime",
            "accelerator.cudnn: cuDNN the wheel runs with (installed nvidia-cudnn-cu13): expected 9.20.0.48, "
            "actual 9.20.0.47",
        ),
        (
            {"nvidia_dists": {"nvidia-cudnn-cu13": "9.20.0.48", "nvidia-nccl-cu13": "2.29.3"}},
            "nccl_runtime",
            "accelerator.nccl: NCCL the wheel runs with (installed nvidia-nccl-cu13): expected 2.29.7, actual 2.29.3",
        ),
        ({"nccl_version": (2, 27, 5)}, "nccl", "accelerator.nccl: NCCL version"),
        ({"nccl_version": (2, 27, 5)}, "nccl", "expected 2.29.7, actual 2.27.5"),
        (
            {"mkl_version": "2025.3"},
            "mkl_version",
            "blas.mkl: MKL version (torch.__config__.show()): expected 2024.2, actual 2025.3",
        ),
        ({"mkl_version": None}, "mkl_version", "expected 2024.2, actual None"),
        (
            {"compiler": "GCC 12.2"},
            "compiler",
            "build.gcc: host compiler (torch.__config__.show()): expected GCC 13.x, actual GCC 12.2",
        ),
        ({"compiler": "clang 18.1"}, "compiler", "actual clang 18.1"),
        ({"nccl_available": False, "nccl_version": None}, "nccl", "expected 2.29.7, actual None"),
        ({"has_magma": False}, "magma", "actual False"),
        ({"cuda_version": "12.6"}, "cuda_version", "expected 13.0, actual 12.6"),
        ({"torch_version": "2.13.0+cu130"}, "local_label", "expected +cu130.kiln1, actual +cu130"),
        ({"torch_version": "2.13.1+cu130.kiln1"}, "torch_version", "expected 2.13.0, actual 2.13.1"),
        ({"mkl_available": False}, "blas", "MKL available=False"),
        ({"git_version": "Unknown"}, "git_commit", "actual Unknown"),
        ({"python_version": "3.11"}, "python", "expected 3.12, actual 3.11"),
    ],
)
def test_each_mismatch_fails_naming_expected_and_actual(changes: dict, check: str, needle: str) -> None:
    result = buildconfig.recipe_checks(load_recipe(CU130), cuda_facts(**changes))[check]
    assert result.status == "fail"
    assert needle in result.message, result.message
    others = {
        k
        for k, c in buildconfig.recipe_checks(load_recipe(CU130), cuda_facts(**changes)).items()
        if c.status == "fail"
    }
    assert check in others


def test_cuda_silently_compiled_out_is_named() -> None:
    facts = cuda_facts(
        settings={"USE_CUDA": "0", "BUILD_TYPE": "Release", "BLAS_INFO": "mkl"},
        cuda_version=None,
        cuda_built=False,
    )
    result = buildconfig.recipe_checks(load_recipe(CU130), facts)["use_cuda"]
    assert result.status == "fail"
    assert "expected USE_CUDA=ON (recipe asks for CUDA 13.0), actual USE_CUDA=0" in result.message


@pytest.mark.parametrize(
    ("tags", "status"),
    [
        (("cp312-cp312-manylinux_2_28_x86_64",), "pass"),
        (("cp311-cp311-linux_x86_64",), "fail"),
        (("cp312-cp312-linux_aarch64",), "fail"),
        ((), "skip"),
    ],
)
def test_wheel_tag_matches_interpreter_and_machine(tags: tuple[str, ...], status: str) -> None:
    assert buildconfig.self_checks(cuda_facts(wheel_tags=tags))["wheel_tag"].status == status


@pytest.mark.parametrize(
    ("dists", "status", "needle"),
    [
        (
            {"nvidia-cudnn-cu13": "9.24.0.43"},
            "fail",
            "nvidia-cudnn-cu13 9.24.0.43 is not the cudnn torch loads (9.20.0",
        ),
        ({"nvidia-nccl-cu13": "2.30.7"}, "fail", "nvidia-nccl-cu13 2.30.7 (torch has nccl 2.29.7)"),
        ({"nvidia-nccl-cu13": "2.29.70"}, "fail", "2.29.70"),
        ({}, "skip", "no nvidia-cudnn/nvidia-nccl PyPI packages are installed"),
    ],
)
def test_installed_nvidia_packages_match_torch(dists: dict, status: str, needle: str) -> None:
    """smoke_test.py --pypi-pkg-check: a stray cuDNN/NCCL wheel shadows the one torch was built with."""
    check = buildconfig.self_checks(cuda_facts(nvidia_dists=dists))["nvidia_packages"]
    assert (check.status, needle in check.message) == (status, True), check.message


def test_cuda_build_without_cudnn_fails_without_a_recipe() -> None:
    facts = cuda_facts(cudnn_available=False, cudnn_compile=None, cudnn_runtime=None)
    result = buildconfig.self_checks(facts)["cudnn_in_cuda_build"]
    assert result.status == "fail"
    assert "cuDNN compiled into a CUDA 13.0 build" in result.message and "actual False" in result.message


def test_cudnn_runtime_mismatch_and_incompatibility() -> None:
    """cuDNN's rule: a newer minor of the same major runs a program built against 9.20; an older or another
    major does not (the full table: tests/test_libcompat.py)."""
    result = buildconfig.self_checks(cuda_facts(cudnn_runtime=(9, 21, 0)))["cudnn_runtime"]
    assert result.status == "pass", result.message
    result = buildconfig.self_checks(cuda_facts(cudnn_runtime=(9, 19, 0)))["cudnn_runtime"]
    assert (result.status, result.message.endswith("expected 9.20.0, or a later 9.x, actual 9.19.0")) == (
        "fail",
        True,
    ), result.message
    assert "cuDNN 9.19.0 is older than the compiled 9.20.0" in result.message
    error = "cuDNN version incompatibility: PyTorch was compiled  against (9, 20, 0) but found runtime version (8, 9, 7)"
    result = buildconfig.self_checks(cuda_facts(cudnn_runtime=None, cudnn_error=error))["cudnn_runtime"]
    assert result.status == "fail" and "incompatibility" in result.message


def test_recipe_flags_compared_when_reported() -> None:
    recipe = load_recipe(CPU)  # USE_MKLDNN = true
    facts = cuda_facts(settings={**cuda_facts().settings, "USE_MKLDNN": "OFF"})
    result = buildconfig.recipe_checks(recipe, facts)["flags"]
    assert result.status == "fail" and "USE_MKLDNN: expected 1, actual OFF" in result.message


def describing_recipe(local_version: str | None = None) -> Recipe:
    """A recipe that describes the torch this Python imports, which is whatever the index gave for the pinned
    torch==2.13.0: a CPU build where a CPU index or find-links offer 2.13.0+cpu, else upstream's 2.13.0
    (CUDA 13.0). For the CPU build, the shipped CPU recipe with its local label (+cpu) and gcc 13 (the wheel
    says "GCC 13.3"; the shipped recipe leaves gcc to the host); for a CUDA build, the reference tier's recipe
    of that upstream wheel (tests/reference/recipes, which `nox -s reference` proves on it). Either with the
    Python running the tests as python.version (the installed wheel's), whichever of 3.10 to 3.14 it is.
    ``local_version`` replaces the recipe's label."""
    torch = need_torch()
    release = torch.__version__.split("+")[0]
    if torch.version.cuda is None:
        data = CPU.read_text().replace('local_version = "+cpu.kiln1"', 'local_version = "+cpu"\ngcc = 13')
        name = "cpu-wheel.toml"
    else:
        label = "cu" + torch.version.cuda.replace(".", "")
        path = REFERENCE_RECIPES / f"upstream-{release}-{label}-py311.toml"
        assert path.is_file(), (
            f"no recipe describes the installed torch {torch.__version__} ({path} is absent)"
        )
        data, name = path.read_text(), path.name
    if local_version is not None:
        data = re.sub(r'(?m)^local_version = "[^"]*"', f"local_version = {local_version!r}", data)
    # the Python running the tests (any of 3.10 to 3.14: upstream publishes the release's wheels for each)
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    data, replaced = re.subn(r'(?m)^(\[python\]\nversion = )"[^"]*"', rf'\g<1>"{running}"', data)
    assert replaced == 1, f"{name}: no [python] version to set"
    return parse_recipe(data.encode(), name)


def test_installed_torch_against_the_recipe_that_describes_it() -> None:
    """The real facts of the installed wheel (CPU or CUDA) against a recipe describing it: every recipe check
    passes."""
    results = buildconfig.recipe_checks(describing_recipe(), buildconfig.collect_facts())
    assert results
    assert {k: c.message for k, c in results.items() if c.status != "pass"} == {}


# --- Report ----------------------------------------------------------------------------------------------


def outcomes() -> list[report.Outcome]:
    return [
        report.Outcome("test_amp.py::a[cpu]", "amp", "passed"),
        report.Outcome("test_amp.py::a[cuda]", "amp", "skipped", "needs CUDA"),
        report.Outcome("test_ddp.py::b", "ddp", "failed", "torchrun exited 1", 2.5),
        report.Outcome("test_ddp.py::c", "ddp", "error", "fixture | broke"),
    ]


def test_summary_counts_per_area(tmp_path: Path) -> None:
    summary = report.summarize(
        outcomes(),
        environment={"torch_version": "x"},
        exit_status=1,
        options={"recipe": None},
        duration_s=1.234,
    )
    zero = {"skipped_no_gpu": 0, "skipped_not_applicable": 0, "skipped_other": 0}
    assert summary["areas"]["amp"] == {"passed": 1, "failed": 0, "skipped": 1, "error": 0} | zero | {
        "skipped_no_gpu": 1
    }
    assert summary["areas"]["ddp"] == {"passed": 0, "failed": 1, "skipped": 0, "error": 1} | zero
    assert summary["areas"]["torchvision"] == {"passed": 0, "failed": 0, "skipped": 0, "error": 0} | zero
    assert summary["totals"] == {"passed": 1, "failed": 1, "skipped": 1, "error": 1} | zero | {
        "skipped_no_gpu": 1
    }
    assert summary["ok"] is False
    report.write_summary(tmp_path, summary)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    md = (tmp_path / "summary.md").read_text()
    assert md.startswith("# torchkiln verify: FAIL")
    assert "| DDP launch | 0 | 1 | 1 | 0 | 0 | 0 | 2.5 |" in md and "fixture \\| broke" in md
    # per area: which checks ran and which need a GPU machine
    assert "- **AMP GradScaler**: ran 1: `a[cpu]`" in md
    assert "  - skipped, need a GPU machine (1): `a[cuda]`" in md
    assert "## Without a GPU" in md and "| AMP GradScaler | 1 | 1 |" in md
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json", "summary.md"]  # no temp files left


@pytest.mark.parametrize(
    ("devices", "two_gpu_skip", "section"),
    [
        ([], "needs at least 2 visible CUDA devices, 0 visible", True),
        (
            ["NVIDIA H200 (sm_90)"],
            report.not_applicable("needs at least 2 visible CUDA devices, 1 visible"),
            False,
        ),
        # whatever a skip says, a machine with a usable GPU is never told it had none
        (["NVIDIA H200 (sm_90)"], "needs at least 2 visible CUDA devices, 1 visible", False),
    ],
)
def test_the_without_a_gpu_section_only_where_no_gpu_was_usable(
    tmp_path: Path, devices: list[str], two_gpu_skip: str, section: bool
) -> None:
    checks = [
        report.Outcome("test_ddp.py::two[cuda]", "ddp", "skipped", two_gpu_skip),
        report.Outcome(
            "test_ddp.py::one[cuda]",
            "ddp",
            "passed" if devices else "skipped",
            "" if devices else "needs CUDA",
        ),
    ]
    summary = report.summarize(
        checks,
        environment={"torch_version": "2.11.0+cu130", "cuda_version": "13.0", "devices": devices},
        exit_status=0,
        options={"recipe": None},
        duration_s=1.0,
    )
    report.write_summary(tmp_path, summary)
    md = (tmp_path / "summary.md").read_text()
    assert ("## Without a GPU" in md) is section
    assert ("no CUDA device was usable here" in md) is section


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("needs CUDA: torch is built with CUDA 13.0 but no device is usable (...)", "no_gpu"),
        ("needs at least 2 visible CUDA devices, 0 visible", "no_gpu"),
        # one GPU: the H200 run of 28 Nov 2026 said "no CUDA device was usable here" of this skip
        (report.not_applicable("needs at least 2 visible CUDA devices, 1 visible"), "not_applicable"),
        ("needs CUDA: torch 2.13.0+cpu is built without CUDA", "not_applicable"),
        ("checks a CPU-only build; torch is built with CUDA 13.0", "not_applicable"),
        ("torchvision is not installed", "other"),
    ],
)
def test_skip_kinds(message: str, kind: str) -> None:
    assert report.skip_kind(message) == kind


def test_environment_names_the_torch_under_test() -> None:
    torch = need_torch()
    env = report.environment()
    assert env["torch_version"] == str(torch.__version__)
    assert env["torch_git_version"] == torch.version.git_version
    assert env["cuda_version"] == torch.version.cuda


# --- nox install helper ------------------------------------------------------------------------------------


def make_wheel(path: Path, name: str, version: str, requires: list[str]) -> Path:
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}-{version}.dist-info/METADATA", meta)
    return path


def test_find_wheels_and_python_tag(tmp_path: Path) -> None:
    assert find_wheels(tmp_path / "missing") == {}
    for tag in ("cp311", "cp312"):
        (tmp_path / f"torch-2.13.0+cpu.kiln1-{tag}-{tag}-linux_x86_64.whl").touch()
    (tmp_path / "torchvision-0.28.0+cpu.kiln1-cp312-cp312-linux_x86_64.whl").touch()
    with pytest.raises(ValueError, match="several torch wheels"):
        find_wheels(tmp_path)
    found = find_wheels(tmp_path, "cp312")
    assert found["torch"].name.startswith("torch-2.13.0+cpu.kiln1-cp312")
    assert found["torchvision"].name.startswith("torchvision-0.28.0")


def test_wheel_requirements_drop_torch_and_extras(tmp_path: Path) -> None:
    wheel = make_wheel(
        tmp_path / "torchvision-0.28.0-py3-none-any.whl",
        "torchvision",
        "0.28.0",
        ["numpy", "torch==2.13.0", "pillow!=8.3.*,>=5.3.0", 'scipy; extra == "scipy"'],
    )
    assert wheel_requirements(wheel, {"torch"}) == ["numpy", "pillow!=8.3.*,>=5.3.0"]


class RecordingSession:
    """Stands in for nox's Session at the pip boundary: records what would be installed."""

    def __init__(self, venv: Path, python: str = "3.11") -> None:
        self.python = python
        self.virtualenv = type("Venv", (), {"location": str(venv)})()
        self.calls: list[tuple[str, ...]] = []

    def install(self, *args: str) -> None:
        self.calls.append(("install", *args))

    def run(self, *args: str) -> None:
        self.calls.append(("run", *args))

    def log(self, *args: object) -> None:
        pass

    def error(self, message: str) -> None:
        raise SystemExit(message)


def test_install_for_verify_uses_dist_wheels_then_fallback(tmp_path: Path) -> None:
    dist, venv = tmp_path / "dist", tmp_path / "venv"
    dist.mkdir()
    venv.mkdir()
    torch_whl = make_wheel(
        dist / "torch-2.13.0+cpu.kiln1-cp311-cp311-linux_x86_64.whl", "torch", "2.13.0", ["sympy"]
    )
    vision_whl = make_wheel(
        dist / "torchvision-0.28.0+cpu.kiln1-cp311-cp311-linux_x86_64.whl",
        "torchvision",
        "0.28.0",
        ["numpy", "torch==2.13.0"],
    )
    session = RecordingSession(venv)
    installed = install_for_verify(session, dist, "torch==2.13.0")
    assert installed == {"torch": torch_whl, "torchvision": vision_whl}
    assert verify_args(dist, installed, ["--report", "out"]) == ["--report", "out"], "no manifest in dist/"
    (dist / "manifest.json").write_text("{}")
    assert verify_args(dist, installed, ["--report", "out"]) == [
        "--manifest",
        str(dist / "manifest.json"),
        "--report",
        "out",
    ]
    assert verify_args(dist, installed, ["--manifest", "m.json"]) == ["--manifest", "m.json"]
    assert session.calls[:3] == [
        ("install", str(torch_whl)),
        ("install", "numpy"),
        ("install", "--force-reinstall", "--no-deps", str(torch_whl), str(vision_whl)),
    ]
    assert ("install", "-e", str(ROOT)) in session.calls
    # NumPy too, whatever torch needs: without it the suite's NumPy interop check can only skip
    assert ("install", "pytest>=8", "pytest-timeout>=2.3", "numpy") in session.calls
    again = RecordingSession(venv)  # same bits: no forced reinstall of a multi-GB wheel
    install_for_verify(again, dist, "torch==2.13.0")
    assert ("install", "--no-deps", str(torch_whl), str(vision_whl)) in again.calls
    torch_whl.unlink()
    vision_whl.unlink()
    back = RecordingSession(venv)  # back to the fallback: the reused venv must not keep the old wheel
    assert install_for_verify(back, dist, "torch==2.13.0") == {}
    assert verify_args(dist, {}, []) == [], "verifying the fallback torch: dist/'s manifest is not about it"
    assert back.calls[:3] == [
        ("install", "torch==2.13.0"),
        ("run", "python", "-m", "pip", "uninstall", "-y", "torchvision"),
        ("install", "--force-reinstall", "--no-deps", "torch==2.13.0"),
    ]
    assert not (venv / "torchkiln-verify-wheels.json").exists()


# --- Bounded subprocesses ----------------------------------------------------------------------------------


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    """A hung helper and the worker it started are both gone after the timeout: no check can hang."""
    pid_file = tmp_path / "grandchild.pid"
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(600)\n"
    )
    start = time.monotonic()
    result = proc.run([sys.executable, "-c", script], timeout=3)
    assert result.timed_out and result.returncode is None
    assert "started" in result.stdout
    assert time.monotonic() - start < 30
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(grandchild):
        time.sleep(0.1)
    assert not _alive(grandchild), "the helper's own child survived the timeout"


def test_timeout_kills_children_in_sessions_of_their_own(tmp_path: Path) -> None:
    """torchrun starts each worker with start_new_session=True, out of reach of a process-group kill, and
    the worker holds the launcher's output pipes: the run must still end at its timeout, the worker dead."""
    pid_file = tmp_path / "worker.pid"
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(600)\n"
    )
    result = proc.run([sys.executable, "-c", script], timeout=3)
    assert result.timed_out and "started" in result.stdout
    worker = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(worker):
        time.sleep(0.1)
    assert not _alive(worker), "the worker in its own session survived the timeout"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie is dead, only not reaped yet (its parent was killed too)


def test_run_reports_exit_status_and_output() -> None:
    result = proc.run([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], timeout=60)
    assert (result.returncode, result.timed_out, result.stdout) == (3, False, "out\n")
    assert "exited 3" in result.describe()
    assert 0 < proc.free_port() < 65536


# --- The build's post-build check: same facts, same comparison -------------------------------------------


def test_facts_survive_json() -> None:
    facts = cuda_facts(torchvision=vision())
    assert buildconfig.BuildFacts.from_json(facts.to_json()) == facts


@pytest.mark.parametrize(
    ("raw", "spelled"),
    [
        (13000, "13.0"),
        (12060, "12.6"),
        (12090, "12.9"),
        (-1, None),
        (0, None),
        (None, None),
        ("12.6", "12.6"),
    ],
)
def test_torchvision_cuda_int_is_compared_as_torch_spells_it(raw: object, spelled: str | None) -> None:
    """torchvision.version.cuda is CUDA_VERSION (major*1000 + minor*10): 13000 on 0.28/0.29 cu130 wheels."""
    assert facts_mod.decode_torchvision_cuda(raw) == spelled  # type: ignore[arg-type]


def vision(**changes: object) -> buildconfig.TorchvisionFacts:
    base = buildconfig.TorchvisionFacts(
        version="0.28.0+cu130.kiln1",
        git_version="8" * 40,
        cuda="13.0",
        cuda_raw=13000,
        has_ops=True,
        extensions=("_C", "image"),
        # what upstream's cu130 wheel has: the three image codecs and nvJPEG, no video decoder
        parts={
            "png": True,
            "jpeg": True,
            "webp": True,
            "nvjpeg": True,
            "ffmpeg": False,
            "video_codec": False,
        },
        part_notes={"nvjpeg": "RuntimeError: Found no NVIDIA driver on your system."},
    )
    return dataclasses.replace(base, **changes)


NO_PNG = "RuntimeError: encode_png: torchvision not compiled with libpng support"


@pytest.mark.parametrize(
    ("changes", "check", "needle"),
    [
        (
            {"cuda": "12.6", "cuda_raw": 12060},
            "cuda",
            "torchvision.version.cuda = 12060) vs torch.version.cuda: expected 13.0, actual 12.6",
        ),
        (
            {"version": "0.28.1+cu130.kiln1"},
            "version",
            "torchvision.version: torchvision version (torchvision.__version__): expected 0.28.0+cu130.kiln1, actual 0.28.1+cu130.kiln1",
        ),
        (
            {"version": "0.27.0+cu130.kiln1"},
            "pairs_torch",
            "does not pair with torch 2.13.0+cu130.kiln1: expected torchvision 0.28.x",
        ),
        ({"has_ops": False, "extensions": ()}, "ops", "ships no .so): expected True, actual False"),
        (
            {"parts": {**vision().parts, "png": False}, "part_notes": {"png": NO_PNG}},
            "features",
            f"torchvision.features.png: expected true, built without it ({NO_PNG})",
        ),
        (
            {"parts": {**vision().parts, "ffmpeg": True}},
            "features",
            "torchvision.features.ffmpeg: expected false, built with it",
        ),
        (
            {"parts": {**vision().parts, "webp": None}, "part_notes": {"webp": "AttributeError: no op"}},
            "features",
            "torchvision.features.webp: expected true, could not tell (AttributeError: no op)",
        ),
    ],
)
def test_torchvision_mismatches_are_named(changes: dict, check: str, needle: str) -> None:
    recipe = load_recipe(CU130)
    result = buildconfig_torchvision.torchvision_checks(recipe, cuda_facts(torchvision=vision(**changes)))[
        check
    ]
    assert result.status == "fail" and needle in result.message, result.message
    good = buildconfig_torchvision.torchvision_checks(recipe, cuda_facts(torchvision=vision()))
    assert {k: c.status for k, c in good.items()} == {
        "pairs_torch": "pass",
        "version": "pass",
        "commit": "skip",
        "cuda": "pass",
        "ops": "pass",
        "features": "pass",
    }


def test_torchvision_parts_without_a_recipe_are_upstreams_and_unprobed_facts_skip() -> None:
    """No recipe (verify on an installed build): upstream's wheels' parts; facts written by a torchkiln that
    did not probe the parts say nothing either way."""
    checks = buildconfig_torchvision.torchvision_checks(None, cuda_facts(torchvision=vision()))
    assert checks["features"].status == "pass", checks["features"].message
    cpu_only = cuda_facts(torchvision=vision(parts={**vision().parts, "nvjpeg": False}), cuda_version=None)
    assert buildconfig_torchvision.torchvision_checks(None, cpu_only)["features"].status == "pass"
    unprobed = buildconfig_torchvision.torchvision_checks(
        load_recipe(CU130), cuda_facts(torchvision=vision(parts={}))
    )
    assert unprobed["features"].status == "skip"


def test_postbuild_checks_are_the_recipe_checks_of_each_built_project() -> None:
    """What `torchkiln build` compares after installing its wheels (tests/test_build.py runs it for real)."""
    torch = need_torch()
    facts = buildconfig.collect_facts()
    # a recipe describing the installed wheel but for its label, as a torchkiln build's (+cpu.kiln1 for
    # upstream's +cpu, +cu130.kiln1 for upstream's 2.13.0 whose torch.version.cuda is 13.0)
    label = "cpu" if torch.version.cuda is None else "cu" + torch.version.cuda.replace(".", "")
    recipe = describing_recipe(local_version=f"+{label}.kiln1")
    checks = buildconfig.postbuild_checks(recipe, facts, ("torch",))
    assert set(checks) == {f"torch.{k}" for k in buildconfig.RECIPE_CHECKS}
    failed = {k: c.message for k, c in checks.items() if c.status == "fail"}
    assert list(failed) == ["torch.local_label"]
    assert failed["torch.local_label"].startswith(
        f"build.local_version: torch local version label: expected +{label}.kiln1"
    )
    both = buildconfig.postbuild_checks(recipe, facts, ("torch", "torchvision"))
    assert {k for k in both if k.startswith("torchvision.")} == {
        f"torchvision.{k}" for k in buildconfig_torchvision.TORCHVISION_CHECKS
    }
