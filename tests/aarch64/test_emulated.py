"""The aarch64 proof under emulation (`nox -s aarch64`, not a default session): upstream's aarch64 torch 2.13.0
/ torchvision 0.28.0 installed in an arm64 Debian root run by qemu-user (arm64root.py), and there

- ``torchkiln verify`` against the recipe that describes that pair (tests/reference/recipes/
  upstream-2.13.0-cu130-py311-aarch64.toml) passes every check that runs without a GPU, the GPU checks
  skipped with their reason;
- one-field controls of that recipe fail, each naming its field (compared against the facts collected once in
  the root, as the x86_64 reference tier does);
- upstream's x86_64 recipe of the same release fails there by build.platform, and ``torchkiln check`` refuses
  the shipped x86_64 recipe on that aarch64 machine by name.

And on this machine: the shipped aarch64 recipe against upstream's cp312 aarch64 wheel file itself (version.py,
Requires-Dist pins, the -gencode list of libtorch_cuda.so, the bundled NVPL, no MAGMA).
"""

from __future__ import annotations

import json
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
from kit import ROOT, arm64root, realtrees
from kit.imagekit import require
from test_compat_wheels import _gencode_arch_list, _pins, _version_py

from torchkiln.recipe.compat import compat
from torchkiln.recipe.loader import load_recipe

REFERENCE = ROOT / "tests" / "reference" / "recipes" / "upstream-2.13.0-cu130-py311-aarch64.toml"
X86_REFERENCE = ROOT / "tests" / "reference" / "recipes" / "upstream-2.13.0-cu130-py311.toml"
SHIPPED = ROOT / "recipes" / "torch-2.13-cu130-py312-aarch64.toml"
X86_SHIPPED = ROOT / "recipes" / "torch-2.13-cu130-py312.toml"
INSIDE = "/src"  # the checkout, as the root sees it

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def root() -> Path:
    found = arm64root.problems()
    require(not found, "; ".join(found))
    start = time.monotonic()
    path = arm64root.make_root()
    print(f"arm64 root ready in {time.monotonic() - start:.0f} s: {path}")
    return path


def inside(path: Path) -> str:
    return f"{INSIDE}/{path.relative_to(ROOT)}"


def in_root(root: Path, script: str, timeout: float = 1800) -> str:
    done = arm64root.run(root, script, checkout=ROOT, timeout=timeout)
    assert done.returncode == 0, done.stdout[-6000:]
    return done.stdout


def test_the_root_runs_upstreams_aarch64_pair(root: Path) -> None:
    out = in_root(
        root,
        "uname -m && python -c 'import platform, torch, torchvision; print(platform.machine(), "
        "torch.__version__, torchvision.__version__, torch.version.cuda, (torch.ones(3) @ torch.ones(3)).item())'",
    )
    assert out.split()[0] == "aarch64"
    assert "aarch64 2.13.0+cu130 0.28.0+cu130 13.0 3.0" in out


def test_verify_passes_against_the_aarch64_reference_recipe(root: Path) -> None:
    """`torchkiln verify` under emulation (every area but ddp): exit 0, nothing failed, the CUDA checks skipped
    with the reason (no GPU), the recipe comparison passed field by field (platform, BLAS, arch list among
    them)."""
    start = time.monotonic()
    areas = " ".join(f"--area {a}" for a in arm64root.AREAS_BUT_DDP)
    out = in_root(
        root,
        f"cd /tmp && python -m torchkiln verify --recipe {inside(REFERENCE)} --report /tmp/report {areas}",
    )
    seconds = time.monotonic() - start
    summary = json.loads((root / "tmp" / "report" / "summary.json").read_text())
    print(f"verify under emulation: {seconds:.0f} s, {summary['totals']}")
    checks: list[dict[str, Any]] = summary["checks"]
    assert summary["ok"] and not [c for c in checks if c["outcome"] == "failed"], out[-4000:]
    passed = {c["nodeid"].split("::", 1)[1] for c in checks if c["outcome"] == "passed"}
    for name in ("platform", "blas", "arch_list", "magma", "cuda_version", "cudnn", "nccl", "compiler"):
        assert f"test_build_matches_recipe[{name}]" in passed, (name, sorted(passed))
    assert summary["totals"]["skipped_no_gpu"] > 0
    assert any("no device is usable" in c["message"] for c in checks if c["outcome"] == "skipped")


def test_one_ddp_launch_passes_under_emulation(root: Path) -> None:
    """torchrun --standalone, two gloo workers on the aarch64 build, parameters identical across ranks: the
    DDP area's first check, with a deadline that fits qemu (TORCHKILN_VERIFY_DDP_TIMEOUT)."""
    out = in_root(
        root,
        "cd /tmp && TORCHKILN_VERIFY_DDP_TIMEOUT=900 python -m torchkiln verify --area ddp "
        "-- -k test_standalone_params_identical_across_ranks",
    )
    assert "1 passed" in out, out[-3000:]


def test_one_field_controls_fail_by_name_and_the_x86_64_recipe_by_platform(root: Path) -> None:
    script, recipes = arm64root.write_controls(
        ROOT / ".torchkiln" / "aarch64-controls", REFERENCE, X86_REFERENCE
    )
    seen = {name: inside(path) for name, path in recipes.items()}
    out = in_root(root, f"cd /tmp && python {inside(script)} {' '.join(seen.values())}")
    arm64root.check_controls(out, seen)


def test_check_refuses_the_x86_64_recipe_on_this_aarch64_machine_by_name(root: Path) -> None:
    done = arm64root.run(root, f"cd /tmp && python -m torchkiln check {inside(X86_SHIPPED)}", checkout=ROOT)
    assert done.returncode == 2, done.stdout[-3000:]
    assert "host: platform: found this machine is aarch64; needs an x86_64 machine" in done.stdout
    assert "build.platform = 'x86_64'" in done.stdout and "Traceback" not in done.stdout
    arm = arm64root.run(root, f"cd /tmp && python -m torchkiln check {inside(SHIPPED)}", checkout=ROOT)
    assert "host: platform:" not in arm.stdout, arm.stdout[-3000:]


def test_shipped_aarch64_recipe_is_upstreams_aarch64_wheel() -> None:
    """The cp312 aarch64 wheel file read here as a zip (nothing installed): the recipe's version, pins and arch
    list are the wheel's, NVPL is bundled, MAGMA is not linked."""
    wheel = realtrees.pypi_wheel("torch===2.13.0", python_version="3.12", platform="manylinux_2_28_aarch64")
    recipe = load_recipe(SHIPPED)
    assert wheel.name == "torch-2.13.0-cp312-cp312-manylinux_2_28_aarch64.whl"
    version = _version_py(wheel, "torch")
    assert (version["__version__"], version["cuda"]) == ("2.13.0+cu130", str(recipe.accelerator.cuda))
    pins = _pins(wheel)
    assert pins["nvidia-cudnn-cu13"] == str(recipe.accelerator.cudnn)
    assert pins["nvidia-nccl-cu13"] == str(recipe.accelerator.nccl)
    arch = _gencode_arch_list(wheel)
    assert arch == list(recipe.accelerator.arch_list) == compat()["cuda"]["13.0"]["aarch64_arch"]
    with zipfile.ZipFile(wheel) as z:
        libs = {n.rsplit("/", 1)[1] for n in z.namelist() if n.startswith("torch/lib/")}
        linalg = z.read("torch/lib/libtorch_cuda_linalg.so")
    assert {
        "libnvpl_blas_lp64_gomp.so.0",
        "libnvpl_lapack_lp64_gomp.so.0",
    } <= libs and recipe.blas.kind == "nvpl"
    assert not any("mkl" in name for name in libs)
    assert b"magma_queue_create" not in linalg and recipe.magma is None
