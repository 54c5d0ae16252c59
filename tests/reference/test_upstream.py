"""Ground truth: torchkiln's verify on upstream's own CUDA release builds, installed from PyPI.

The reference recipe (tests/reference/recipes/) describes exactly what upstream built; the reference run
must pass every check that can run without a GPU, and skip the others saying so. Each negative control is
the reference recipe with ONE field changed: the same run must then fail, and the failure must name that
field with the expected and the actual value. A control that does not fail is a check that cannot tell a
wrong build from the right one.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from torchkiln.recipe.loader import load_recipe
from torchkiln.verify import report

ROOT = Path(__file__).resolve().parents[2]
ENV = "TORCHKILN_REFERENCE_RECIPE"  # set by `nox -s reference` (see conftest.py)
REPORT_ENV = "TORCHKILN_REFERENCE_REPORT"
TIMEOUT = 600
Doc = dict[str, Any]


def reference_path() -> Path:
    return Path(os.environ[ENV]).resolve()


def reference_doc() -> Doc:
    return tomllib.loads(reference_path().read_text())


def verify(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchkiln", "verify", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        cwd=cwd,
    )


# --- the reference run -----------------------------------------------------------------------------------


def test_the_installed_pair_is_the_reference() -> None:
    import torch
    import torchvision

    recipe = load_recipe(reference_path())
    assert torch.__version__ == recipe.torch_wheel_version
    assert torchvision.__version__ == recipe.torchvision_wheel_version
    assert torch.version.cuda == str(recipe.accelerator.cuda)
    assert torch.cuda.is_available() is False or os.environ.get("TORCHKILN_REFERENCE_GPU") == "1"


@pytest.fixture(scope="module")
def reference_summary(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The report of `torchkiln verify --recipe <reference>`: the nox session's run, else one made here."""
    given = os.environ.get(REPORT_ENV)
    if given and (Path(given) / "summary.json").is_file():
        return json.loads((Path(given) / "summary.json").read_text())
    out = tmp_path_factory.mktemp("reference-report")
    result = verify("--recipe", str(reference_path()), "--report", str(out), cwd=out)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


def test_reference_run_passes_every_check_that_can_run_without_a_gpu(reference_summary: dict) -> None:
    assert reference_summary["ok"], reference_summary["failures"]
    totals = reference_summary["totals"]
    assert (totals["failed"], totals["error"]) == (0, 0)
    # Every recipe comparison and every torchvision check ran: none may hide behind a skip.
    ran = {c["nodeid"].split("::")[-1] for c in reference_summary["checks"] if c["outcome"] == "passed"}
    for check in (
        "torch_version",
        "cuda_version",
        "cudnn",
        "nccl",
        "arch_list",
        "magma",
        "mkl_version",
        "compiler",
        "git_commit",
        "flags",
        "python",
    ):
        assert f"test_build_matches_recipe[{check}]" in ran, sorted(ran)
    for test in (
        "test_version_is_the_recipes",
        "test_commit_is_the_recipes",
        "test_cuda_version_matches_torch",
        "test_compiled_ops_loaded",
        "test_png_round_trip",
        "test_jpeg_round_trip",
        # the release checks (verify/test_release.py) and the NCCL/MAGMA self-checks, on upstream's wheels
        "test_libraries_resolve_without_ld_library_path[torch]",
        "test_libraries_resolve_without_ld_library_path[torchvision]",
        "test_onednn_runs_cpu_convolution",
        "test_compiled_module_equals_eager[cpu]",
        "test_build_is_consistent[nccl_in_cuda_build]",
        "test_build_is_consistent[magma_linked]",
    ):
        assert test in ran, sorted(ran)


def test_reference_run_skips_only_for_lack_of_a_gpu(reference_summary: dict) -> None:
    """A skip on upstream's CUDA build is either a GPU-only check on a GPU-less machine, or a check of a
    CPU-only build; each says which. Anything else would be a check quietly not running."""
    kinds = {s["nodeid"]: s["kind"] for s in reference_summary["skips"]}
    assert set(kinds.values()) <= {"no_gpu", "not_applicable"}, kinds
    for skip in reference_summary["skips"]:
        if skip["kind"] == "no_gpu":
            assert "cannot tell a working CUDA build from a broken one" in skip["message"] or skip[
                "message"
            ].startswith("needs at least 2 visible CUDA devices"), skip


# --- negative controls: one field changed, the run fails naming it ----------------------------------------


def _set(doc: Doc, dotted: str, value: Any) -> Doc:
    doc = copy.deepcopy(doc)
    *tables, key = dotted.split(".")
    node = doc
    for table in tables:
        node = node.setdefault(table, {})
    if value is None:
        node.pop(key, None)
    else:
        node[key] = value
    return doc


def _cuda_126(doc: Doc) -> Doc:
    # CUDA 12.6 cannot target sm_100/sm_120 (a valid 12.6 recipe drops them); cuDNN 9.20 / NCCL 2.29.7 have
    # 12.x builds too. What the run must name is the CUDA version.
    doc = _set(doc, "accelerator.cuda", "12.6")
    return _set(doc, "accelerator.arch_list", ["7.5", "8.0", "8.6", "9.0"])


def _cpu(doc: Doc) -> Doc:
    doc = _set(doc, "accelerator", {"kind": "cpu"})
    doc = _set(doc, "magma", None)
    doc = _set(
        doc, "torchvision.features.nvjpeg", False
    )  # a CPU recipe that kept it is refused before verify
    return _set(doc, "build.local_version", "+cpu")


def _three(value: str) -> str:
    return ".".join(value.split(".")[:3])


# (id, change, field the failure must name, text it must contain given the reference doc)
CONTROLS: list[tuple[str, Callable[[Doc], Doc], str, Callable[[Doc], str]]] = [
    (
        "cuda-12.6",
        _cuda_126,
        "accelerator.cuda",
        lambda r: f"expected 12.6, actual {r['accelerator']['cuda']}",
    ),
    (
        "cudnn-pin",
        lambda d: _set(d, "accelerator.cudnn", "9.19.0.56"),
        "accelerator.cudnn",
        lambda r: f"expected 9.19.0, actual {_three(r['accelerator']['cudnn'])}",
    ),
    (
        "cudnn-package-build",  # same 9.x.y, another package build: only the installed wheel tells
        lambda d: _set(d, "accelerator.cudnn", _three(d["accelerator"]["cudnn"]) + ".1"),
        "accelerator.cudnn",
        lambda r: f"actual {r['accelerator']['cudnn']}",
    ),
    (
        "nccl-pin",
        lambda d: _set(d, "accelerator.nccl", "2.28.9"),
        "accelerator.nccl",
        lambda r: f"expected 2.28.9, actual {r['accelerator']['nccl']}",
    ),
    (
        "arch-list-without-12.0",
        lambda d: _set(d, "accelerator.arch_list", [a for a in d["accelerator"]["arch_list"] if a != "12.0"]),
        "accelerator.arch_list",
        lambda r: "unexpected ['sm_120']",
    ),
    (
        "arch-list-with-ptx",  # the cu130 recipes used to claim "12.0+PTX" was upstream's list
        lambda d: _set(d, "accelerator.arch_list", [*d["accelerator"]["arch_list"][:-1], "12.0+PTX"]),
        "accelerator.arch_list",
        lambda r: "missing ['compute_120']",
    ),
    (
        # upstream's cu130 wheels all have MAGMA, so "asked but absent" cannot be staged on them: the control
        # is its mirror image (the unit tests cover has_magma=False against a recipe with [magma]).
        "magma-not-asked",
        lambda d: _set(d, "magma", None),
        "magma",
        lambda r: "expected False (recipe has no [magma]), actual True",
    ),
    (
        "torchvision-release",
        lambda d: _set(d, "torchvision.version", f"0.{int(d['torchvision']['version'].split('.')[1])}.1"),
        "torchvision.version",
        lambda r: f"actual {r['torchvision']['version']}+cu130",
    ),
    (
        "cpu-recipe",
        _cpu,
        "accelerator.kind",
        lambda r: "expected USE_CUDA=OFF (CPU recipe), actual USE_CUDA=1",
    ),
    (
        "mkl-version",
        lambda d: _set(d, "blas.mkl", "2025.3.0"),
        "blas.mkl",
        lambda r: "expected 2025.3, actual 2024.2",
    ),
    ("gcc", lambda d: _set(d, "build.gcc", 12), "build.gcc", lambda r: "expected GCC 12.x, actual GCC 13.3"),
    (
        "build-number-post",
        lambda d: _set(
            _set(
                _set(d, "build.local_version", None),
                "build.pytorch_build_version",
                f"{d['torch']['version']}+cu130",
            ),
            "build.pytorch_build_number",
            2,
        ),
        "build.pytorch_build_version",
        lambda r: "expected +cu130.post2, actual +cu130",
    ),
    (
        "torchvision-commit",
        lambda d: _set(d, "torchvision.commit", "0" * 40),
        "torchvision.commit",
        lambda r: f"expected {'0' * 40}, actual {r['torchvision']['commit']}",
    ),
]


def _run_control(case: tuple[str, Callable[[Doc], Doc], str, Callable[[Doc], str]], root: Path) -> dict:
    case_id, change, _, _ = case
    directory = root / case_id
    directory.mkdir()
    recipe = directory / "recipe.toml"
    recipe.write_text(tomli_w.dumps(change(reference_doc())))
    out = directory / "report"
    result = verify(
        "--recipe",
        str(recipe),
        "--area",
        "build_config",
        "--area",
        "torchvision",
        "--report",
        str(out),
        "--",
        "-q",
        "-k",
        "matches_recipe or torchvision",
        cwd=directory,
    )
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else None
    return {
        "returncode": result.returncode,
        "output": result.stdout[-4000:] + result.stderr[-2000:],
        "summary": summary,
    }


@pytest.fixture(scope="module")
def control_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Every control run once, two at a time (each run is mostly importing torch)."""
    root = tmp_path_factory.mktemp("controls")
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = pool.map(lambda case: (case[0], _run_control(case, root)), CONTROLS)
        return dict(results)


@pytest.mark.parametrize("case", CONTROLS, ids=[c[0] for c in CONTROLS])
def test_negative_control_fails_naming_its_field(case: tuple, control_runs: dict[str, dict]) -> None:
    case_id, _, field, needle = case
    run = control_runs[case_id]
    assert run["returncode"] == 1, run["output"]
    failures = run["summary"]["failures"]
    naming = [f["message"] for f in failures if f["message"].startswith(f"{field}: ")]
    assert naming, (field, [f["message"] for f in failures])
    assert any(needle(reference_doc()) in m for m in naming), (needle(reference_doc()), naming)
    # the change is the cause: nothing but checks of that field (and what follows from it) failed
    assert all(f["area"] in ("build_config", "torchvision") for f in failures)


def test_an_impossible_pairing_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """torchvision 0.27 with torch 2.13/2.14 is no recipe at all: refused at load, exit 2, naming it."""
    doc = reference_doc()
    minor = int(doc["torchvision"]["version"].split(".")[1])
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(tomli_w.dumps(_set(doc, "torchvision.version", f"0.{minor - 1}.0")))
    result = verify("--recipe", str(recipe), cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"torchvision.version: torchvision 0.{minor - 1}.0 does not pair with torch" in result.stderr


def test_every_skip_kind_is_known() -> None:
    assert set(report.SKIP_KINDS) == {"no_gpu", "not_applicable", "other"}
