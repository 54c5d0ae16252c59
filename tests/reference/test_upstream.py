"""Ground truth: torchkiln's verify on upstream's own CUDA release builds, installed from PyPI.

The reference recipe (tests/reference/recipes/) describes exactly what upstream built; the reference run
must pass every check that can run without a GPU, and skip the others saying so. Each negative control is
the reference recipe with ONE field changed: the comparison must then fail, and the failure must name that
field with the expected and the actual value. A control that does not fail is a check that cannot tell a
wrong build from the right one. The controls are compared in this process against facts collected once
(the comparison ``torchkiln verify`` and the build's post-build check run); one of them also goes through
the whole of ``torchkiln verify``, whose report must list exactly the same failures.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from kit import ROOT
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from torchkiln.recipe.compat import compat
from torchkiln.recipe.loader import load_recipe
from torchkiln.shipped import tomllib
from torchkiln.verify import buildconfig, linkage, report
from torchkiln.verify.facts import BuildFacts

ENV = "TORCHKILN_REFERENCE_RECIPE"  # set by `nox -s reference` (see conftest.py)
REPORT_ENV = "TORCHKILN_REFERENCE_REPORT"
TIMEOUT = 600
Doc = dict[str, Any]


def reference_path() -> Path:
    return Path(os.environ[ENV]).resolve()


def reference_doc() -> Doc:
    return tomllib.loads(reference_path().read_text())


def verify(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchkiln", "verify", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        cwd=cwd,
        env=env,
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
        "cudnn_runtime",
        "nccl",
        "nccl_runtime",
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
        "test_cpu_matmul_is_exact_on_small_integers[67x45-float32]",
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


# --- a GPU host whose CUDA cannot initialise --------------------------------------------------------------

GPU_HOST = ROOT / "tests" / "data" / "gpu_host"  # an nvidia-smi that lists one H100, as `nvidia-smi -L` does


def test_a_gpu_host_whose_cuda_cannot_initialise_fails(tmp_path: Path) -> None:
    """This machine made a GPU host at its boundary only (an nvidia-smi on PATH that lists a GPU); torch,
    its CUDA runtime and the checks are upstream's and the suite's, and CUDA cannot initialise (no driver).
    verify must fail every CUDA check, saying why in the header, the report and each failure; with
    --no-require-cuda the same checks skip."""
    if os.environ.get("TORCHKILN_REFERENCE_GPU") == "1":
        pytest.skip("a real GPU machine: its CUDA initialises")  # the GPU run uses the real nvidia-smi
    env = {**os.environ, "PATH": f"{GPU_HOST}{os.pathsep}{os.environ['PATH']}"}
    out = tmp_path / "report"
    args = ("--area", "torchvision", "--report", str(out), "--", "-k", "nms")
    result = verify(*args, cwd=tmp_path, env=env)
    assert result.returncode == 1, result.stdout[-6000:] + result.stderr[-3000:]
    why = "this machine has an NVIDIA GPU (nvidia-smi -L lists GPU 0: NVIDIA H100 80GB HBM3) and torch is a CUDA build"
    assert f"require-cuda: yes ({why}" in result.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["options"]["require_cuda"] is True and summary["options"][
        "require_cuda_reason"
    ].startswith(why)
    assert f"CUDA required: yes ({why}" in (out / "summary.md").read_text()
    (failure,) = summary["failures"]
    assert failure["nodeid"].endswith("test_nms_runs[cuda]"), failure
    assert failure["message"].startswith(f"CUDA is required ({why}"), failure
    assert "torch.cuda.init(): Found no NVIDIA driver on your system" in failure["message"], failure
    skipped = verify("--no-require-cuda", *args, cwd=tmp_path, env=env)
    assert skipped.returncode == 0, skipped.stdout[-6000:] + skipped.stderr[-3000:]
    assert "require-cuda: no (--no-require-cuda was given)" in skipped.stdout
    assert [s["kind"] for s in json.loads((out / "summary.json").read_text())["skips"]] == ["no_gpu"]


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


def _label(doc: Doc) -> str:
    return doc["build"]["local_version"]  # "+cu128": what describe wrote from torch.__version__


def _other_cuda(doc: Doc) -> Doc:
    """Another CUDA the release builds with (the same major first), its upstream arch list with it: only the
    CUDA version differs from what the wheel reports."""
    release = compat()["torch"][".".join(doc["torch"]["version"].split(".")[:2])]
    actual = Version(doc["accelerator"]["cuda"])
    others = [
        Version(v)
        for v in compat()["cuda"]
        if Version(v) in SpecifierSet(release["cuda"]) and Version(v) != actual
    ]
    other = min(others, key=lambda v: (v.major != actual.major, abs(v.minor - actual.minor)))
    doc = _set(doc, "accelerator.cuda", str(other))
    rule = compat()["cudnn_min_sm"]  # cuDNN >= 9.11 refuses SM < 7.5: keep the list one the rules accept
    low = Version(doc["accelerator"]["cudnn"]) >= Version(rule["since"])
    archs = [
        a
        for a in compat()["cuda"][str(other)]["default_arch"]
        if "+" not in a and not (low and Version(a.rstrip("af")) < Version(rule["min_arch"]))
    ]
    return _set(doc, "accelerator.arch_list", archs)


def _cpu(doc: Doc) -> Doc:
    doc = _set(doc, "accelerator", {"kind": "cpu"})
    doc = _set(doc, "magma", None)
    doc = _set(
        doc, "torchvision.features.nvjpeg", False
    )  # a CPU recipe that kept it is refused before verify
    return _set(doc, "build.local_version", "+cpu")


def _installed_setting(key: str) -> str:
    import torch

    return buildconfig.parse_build_settings(torch.__config__.show())[key]


def _next_patch(version: str) -> str:
    major, minor, patch = version.split(".")
    return f"{major}.{minor}.{int(patch) + 1}"


def _three(value: str) -> str:
    return ".".join(value.split(".")[:3])


def _earlier_minor(value: str) -> str:
    """9.20.0.48 -> 9.19.0; 2.27.3 -> 2.26.3: the same major, one minor back (rules accept it, the build differs)."""
    major, minor, *rest = value.split(".")
    return ".".join([major, str(int(minor) - 1), *rest[:1]])


def _cudnn_shipped_field(doc: Doc) -> str:
    return "cudnn_runtime" if "cudnn_runtime" in doc["accelerator"] else "cudnn"


def _other_gcc(doc: Doc) -> int:
    """A host gcc the release and its CUDA accept that is not the one the wheel reports."""
    release = compat()["torch"][".".join(doc["torch"]["version"].split(".")[:2])]
    newest = compat()["cuda"][doc["accelerator"]["cuda"]]["max_gcc"]
    actual = doc["build"]["gcc"]
    return actual - 1 if actual - 1 >= release["min_gcc"] else min(actual + 1, newest)


def _last_arch(doc: Doc) -> str:
    return doc["accelerator"]["arch_list"][-1]


def _sm(entry: str) -> str:
    return entry.split("+")[0].replace(".", "")


def _ptx_flipped(doc: Doc) -> Doc:
    last = _last_arch(doc)
    flipped = last.removesuffix("+PTX") if last.endswith("+PTX") else f"{last}+PTX"
    return _set(doc, "accelerator.arch_list", [*doc["accelerator"]["arch_list"][:-1], flipped])


# (id, change, field the failure must name, text it must contain given the reference doc). Every value is
# derived from the pair's own recipe, so the controls hold for every release (nox -s releases).
CONTROLS: list[tuple[str, Callable[[Doc], Doc], str | Callable[[Doc], str], Callable[[Doc], str]]] = [
    (
        "other-cuda",
        _other_cuda,
        "accelerator.cuda",
        lambda r: f"expected {_other_cuda(r)['accelerator']['cuda']}, actual {r['accelerator']['cuda']}",
    ),
    (
        "cudnn-compiled",
        lambda d: _set(d, "accelerator.cudnn", _earlier_minor(d["accelerator"]["cudnn"])),
        "accelerator.cudnn",
        lambda r: (
            f"expected {_earlier_minor(r['accelerator']['cudnn'])}, actual {_three(r['accelerator']['cudnn'])}"
        ),
    ),
    (
        "cudnn-package-build",  # same 9.x.y, another package build: only the installed wheel tells
        lambda d: _set(
            d,
            f"accelerator.{_cudnn_shipped_field(d)}",
            _three(d["accelerator"][_cudnn_shipped_field(d)]) + ".1",
        ),
        lambda r: f"accelerator.{_cudnn_shipped_field(r)}",
        lambda r: f"actual {r['accelerator'][_cudnn_shipped_field(r)]}",
    ),
    (
        "nccl-compiled",
        lambda d: _set(d, "accelerator.nccl", _earlier_minor(d["accelerator"]["nccl"])),
        "accelerator.nccl",
        lambda r: f"expected {_earlier_minor(r['accelerator']['nccl'])}, actual {r['accelerator']['nccl']}",
    ),
    (
        "arch-list-without-last",
        lambda d: _set(d, "accelerator.arch_list", d["accelerator"]["arch_list"][:-1]),
        "accelerator.arch_list",
        lambda r: f"unexpected ['sm_{_sm(_last_arch(r))}'",
    ),
    (
        "arch-list-ptx-flipped",  # the cu130 recipes used to claim "12.0+PTX" was upstream's list
        _ptx_flipped,
        "accelerator.arch_list",
        lambda r: f"['compute_{_sm(_last_arch(r))}']",
    ),
    (
        # upstream's x86_64 CUDA wheels all have MAGMA, so "asked but absent" cannot be staged on them: the
        # control is its mirror image (the unit tests cover has_magma=False against a recipe with [magma]).
        "magma-not-asked",
        lambda d: _set(d, "magma", None),
        "magma",
        lambda r: "expected False (recipe has no [magma]), actual True",
    ),
    (
        "torchvision-release",
        lambda d: _set(d, "torchvision.version", _next_patch(d["torchvision"]["version"])),
        "torchvision.version",
        lambda r: f"actual {r['torchvision']['version']}{_label(r)}",
    ),
    (
        "cpu-recipe",
        _cpu,
        "accelerator.kind",
        # spelled as the wheel's Build settings do: USE_CUDA=ON (2.12.1), USE_CUDA=1 (2.13.0, 2.14.x)
        lambda r: f"expected USE_CUDA=OFF (CPU recipe), actual USE_CUDA={_installed_setting('USE_CUDA')}",
    ),
    (
        "mkl-version",
        lambda d: _set(d, "blas.mkl", "2025.3.0"),
        "blas.mkl",
        lambda r: f"expected 2025.3, actual {'.'.join(r['blas']['mkl'].split('.')[:2])}",
    ),
    (
        "gcc",
        lambda d: _set(d, "build.gcc", _other_gcc(d)),
        "build.gcc",
        lambda r: f"expected GCC {_other_gcc(r)}.x, actual GCC {r['build']['gcc']}.",
    ),
    (
        "build-number-post",
        lambda d: _set(
            _set(
                _set(d, "build.local_version", None),
                "build.pytorch_build_version",
                f"{d['torch']['version']}{_label(d)}",
            ),
            "build.pytorch_build_number",
            2,
        ),
        "build.pytorch_build_version",
        lambda r: f"expected {_label(r)}.post2, actual {_label(r)}",
    ),
    (
        "torchvision-commit",
        lambda d: _set(d, "torchvision.commit", "0" * 40),
        "torchvision.commit",
        lambda r: f"expected {'0' * 40}, actual {r['torchvision']['commit']}",
    ),
    (
        "flag-off",  # a USE_* flag the wheel reports ON, asked OFF
        lambda d: _set(d, "build.flags.USE_MKLDNN", False),
        "build.flags",
        lambda r: "USE_MKLDNN: expected 0, actual",
    ),
]


def _control_recipe(case_id: str, change: Callable[[Doc], Doc], root: Path) -> Path:
    directory = root / case_id
    directory.mkdir()
    recipe = directory / "recipe.toml"
    recipe.write_text(tomli_w.dumps(change(reference_doc())))
    return recipe


@pytest.fixture(scope="module")
def installed_facts() -> BuildFacts:
    """What the installed upstream pair reports about itself: collected once, by the code the suite's
    build_config and torchvision areas collect it with."""
    return buildconfig.collect_facts()


@pytest.fixture(scope="module")
def control_verdicts(
    tmp_path_factory: pytest.TempPathFactory, installed_facts: BuildFacts
) -> dict[str, list]:
    """Every control's failing checks: its recipe read by the loader ``verify --recipe`` uses, compared with
    the installed pair by the functions the suite's ``test_build_matches_recipe`` and torchvision checks
    call (``postbuild_checks``: ``recipe_checks`` + ``torchvision_checks``). One process, facts collected
    once: all controls cost about one torch import (a ``verify`` run per control cost 13 imports of torch).
    ``test_a_control_fails_the_same_through_torchkiln_verify`` proves that ``torchkiln verify`` reports
    exactly these failures."""
    root = tmp_path_factory.mktemp("controls")
    verdicts = {}
    for case_id, change, _, _ in CONTROLS:
        recipe = load_recipe(_control_recipe(case_id, change, root))
        checks = buildconfig.postbuild_checks(recipe, installed_facts, ("torch", "torchvision"))
        verdicts[case_id] = [c for c in checks.values() if c.status == "fail"]
    return verdicts


@pytest.mark.parametrize("case", CONTROLS, ids=[c[0] for c in CONTROLS])
def test_negative_control_fails_naming_its_field(case: tuple, control_verdicts: dict[str, list]) -> None:
    case_id, _, field, needle = case
    field = field(reference_doc()) if callable(field) else field
    failures = [c.message for c in control_verdicts[case_id]]
    naming = [m for m in failures if m.startswith(f"{field}: ")]
    assert naming, (field, failures)
    assert any(needle(reference_doc()) in m for m in naming), (needle(reference_doc()), naming)


# The control run through the whole of `torchkiln verify` (suite, report): the arch list, read without a GPU.
E2E_CONTROL = "arch-list-without-last"


def test_a_control_fails_the_same_through_torchkiln_verify(
    tmp_path: Path, control_verdicts: dict[str, list]
) -> None:
    """`torchkiln verify --recipe <control>` exits 1 and its report lists exactly the failures the
    in-process comparison found, each naming its field; nothing outside the two areas fails."""
    change = next(c[1] for c in CONTROLS if c[0] == E2E_CONTROL)
    recipe = _control_recipe(E2E_CONTROL, change, tmp_path)
    out = tmp_path / "report"
    result = verify(
        "--recipe", str(recipe), "--area", "build_config", "--area", "torchvision", "--report", str(out),
        "--", "-q", "-k", "matches_recipe or torchvision",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-6000:] + result.stderr[-3000:]
    failures = json.loads((out / "summary.json").read_text())["failures"]
    assert all(f["area"] in ("build_config", "torchvision") for f in failures), failures
    assert sorted(f["message"] for f in failures) == sorted(c.message for c in control_verdicts[E2E_CONTROL])


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


# --- cuDNN (and NCCL) compiled against one release, shipped with another: cuDNN's rule decides -----------


def test_a_runtime_cudnn_older_than_the_compiled_one_is_refused(tmp_path: Path) -> None:
    """A recipe saying the wheel runs with a cuDNN older than the one it is compiled against is no recipe
    (NVIDIA: a minor release runs only programs built against it or earlier): refused at load, naming it."""
    doc = reference_doc()
    compiled = _three(doc["accelerator"]["cudnn"])
    older = _earlier_minor(compiled)
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(tomli_w.dumps(_set(doc, "accelerator.cudnn_runtime", older)))
    result = verify("--recipe", str(recipe), cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"accelerator.cudnn_runtime: cuDNN {older} is older than the compiled {compiled}" in result.stderr


def test_an_installed_cudnn_older_than_the_compiled_one_fails(installed_facts: BuildFacts) -> None:
    """The installation's own facts with the cuDNN it loads (and its nvidia-cudnn package) one minor older
    than torch's compile version: the self-checks that pass on the real pair fail, naming both versions."""
    compiled = installed_facts.cudnn_compile
    assert compiled is not None
    older = (compiled[0], compiled[1] - 1, 0)
    dists = {
        k: (f"{older[0]}.{older[1]}.0.1" if "cudnn" in k else v)
        for k, v in installed_facts.nvidia_dists.items()
    }
    real = buildconfig.self_checks(installed_facts)
    assert (real["cudnn_runtime"].status, real["nvidia_packages"].status) == ("pass", "pass"), real
    staged = buildconfig.self_checks(
        dataclasses.replace(installed_facts, cudnn_runtime=older, nvidia_dists=dists)
    )
    shown = ".".join(map(str, older))
    assert staged["cudnn_runtime"].status == "fail", staged["cudnn_runtime"]
    assert (
        f"cuDNN {shown} is older than the compiled {'.'.join(map(str, compiled))}"
        in staged["cudnn_runtime"].message
    )
    assert (
        staged["nvidia_packages"].status == "fail"
        and "is older than the compiled" in staged["nvidia_packages"].message
    )


# --- the recipe is describe's ----------------------------------------------------------------------------


def test_the_reference_recipe_is_what_describe_writes(tmp_path: Path) -> None:
    """The committed recipe is `torchkiln recipe describe`'s output for the installed pair, byte for byte
    (regenerate with TORCHKILN_WRITE_RECIPES=1 nox -s releases): no hand edits, nothing stale."""
    out = tmp_path / "described.toml"
    name = reference_path().stem
    result = subprocess.run(
        [sys.executable, "-m", "torchkiln", "recipe", "describe", "--name", name, "--out", str(out)],
        capture_output=True, text=True, timeout=TIMEOUT, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert out.read_text() == reference_path().read_text()


def test_each_promised_system_library_is_one_the_pair_needs_unbundled() -> None:
    """The control of ``[deploy] system_libraries`` (describe writes it where upstream's wheel needs a library
    it does not bundle: torch 2.15.0's libgfortran.so.5 and libquadmath.so.0): with any one promise taken
    away, verify's release check (linkage.check_distribution, as test_libraries_resolve_without_ld_library_path
    calls it) names that library and the file that needs it; with all of them, nothing is unresolved."""
    promised = list(reference_doc().get("deploy", {}).get("system_libraries", []))
    if not promised:
        pytest.skip("the recipe promises no system library: the pair bundles or declares all it needs")
    index = linkage.installed()
    projects = [index[p] for p in ("torch", "torchvision") if p in index]
    for name in promised:
        rest = [p for p in promised if p != name]
        named = {
            e.needed for d in projects for e in linkage.check_distribution(d, index, target=rest).unresolved
        }
        assert named == {name}, (name, named)
    assert not [e for d in projects for e in linkage.check_distribution(d, index, target=promised).unresolved]
