"""linux/arm64 images built on this x86_64 machine, their RUN steps through qemu-user (`nox -s aarch64`; issue 22):

* the devel image of tests/data/cu130-aarch64-devel-test.toml (`torchkiln images --target devel`, Debian
  bookworm arm64 made by ``debootstrap --arch=arm64``, the toolkit, cuDNN and NCCL from NVIDIA's aarch64 PyPI
  wheels laid out for sbsa-linux), and inside it tests/data/cuda_devel_checks.sh as for x86_64: the layout,
  nvcc compiling and linking a kernel for every arch of the recipe, CMake finding the toolkit, cuDNN and NCCL,
  MAGMA built on the MAGMA-shaped tree, the CUDA test extension built twice through ccache against upstream's
  aarch64 torch;
* the runtime image of the aarch64 reference recipe with upstream's aarch64 torch 2.13.0 / torchvision 0.28.0
  standing in for dist/ (tests/dists.manifest_for_upstream), and the verify suite inside it against that
  recipe, every area but ddp (whose torchrun launches outlast its deadline under qemu: test_emulated.py runs
  one launch with a longer one), the GPU checks skipped with their reason.

Every run in the images hides the host's CPUs from torch (Engine.run(emulated=True): engines.HOST_CPUS; without
that, upstream's aarch64 torch dies at import under qemu). Everything aarch64 runs emulated, so this is slow (times go to .torchkiln/images-report.json); a real torch
compile under emulation would take days and is not tried. The two images need their own vfs storage (removed
at the end); the devel image is removed before the runtime image is built.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import arm64root
import pytest
import realtrees
from dists import manifest_for_upstream
from imagekit import ROOT, cli_build, report, require
from imagekit import devel_checks as run_devel_checks

from torchkiln.images.engines import Buildah, Storage
from torchkiln.images.platforms import platform_named
from torchkiln.images.spec import image_tag
from torchkiln.recipe.loader import load_recipe

# Emulated: the devel image and its checks take about 17 minutes here, more than pytest-timeout's default 900 s.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(5400)]

DEVEL_RECIPE = ROOT / "tests" / "data" / "cu130-aarch64-devel-test.toml"
REFERENCE = ROOT / "tests" / "reference" / "recipes" / "upstream-2.13.0-cu130-py311-aarch64.toml"
PAIR = ("torch===2.13.0", "torchvision===0.28.0")
AARCH64_WHEELS = "manylinux_2_28_aarch64"
# qemu modelling Grace's 128-bit SVE (data/compat.toml qemu_cpu): at qemu's default NVPL's sgemm is wrong
QEMU_CPU = platform_named("aarch64").qemu_cpu


@pytest.fixture(scope="module")
def storage_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    found = arm64root.problems()
    require(not found, "; ".join(found))
    require(shutil.which("buildah") is not None, "buildah is not installed (apt-get install buildah)")
    arm64root.register_qemu()
    root = tmp_path_factory.mktemp("buildah-arm64")
    yield root
    engine = Buildah("buildah", Storage(root / "storage", root / "run", "vfs"))
    subprocess.run([*engine.command("rm", "--all")], capture_output=True, check=False)
    subprocess.run([*engine.command("rmi", "--all", "--force")], capture_output=True, check=False)


@pytest.fixture(scope="module")
def engine(storage_root: Path) -> Buildah:
    return Buildah("buildah", Storage(storage_root / "storage", storage_root / "run", "vfs"))


def architecture(engine: Buildah, image: str) -> str:
    done = subprocess.run(
        engine.command("inspect", "--type", "image", "--", image), capture_output=True, text=True, check=True
    )
    return str(json.loads(done.stdout)["Docker"]["architecture"])


def upstream_pair(dest: Path) -> Path:
    """Upstream's aarch64 torch/torchvision for cp311 (pip's cache keeps them)."""
    for requirement in PAIR:
        wheel = realtrees.pypi_wheel(requirement, python_version="3.11", platform=AARCH64_WHEELS)
        shutil.copy(wheel, dest / wheel.name)
    return dest


@pytest.fixture(scope="module")
def devel_image(engine: Buildah, storage_root: Path) -> str:
    start = time.monotonic()
    assert cli_build(storage_root, DEVEL_RECIPE, "--target", "devel", "--platform", "linux/arm64") == 0
    report("arm64_devel_seconds", round(time.monotonic() - start, 1))
    return image_tag(load_recipe(DEVEL_RECIPE), "devel")


@pytest.fixture(scope="module")
def devel_checks(
    engine: Buildah, devel_image: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list]:
    """tests/data/cuda_devel_checks.sh in the arm64 devel image, emulated, with upstream's aarch64 torch."""
    wheels = tmp_path_factory.mktemp("arm64-torch")
    torch = realtrees.pypi_wheel(PAIR[0], python_version="3.11", platform=AARCH64_WHEELS)
    shutil.copy(torch, wheels / torch.name)
    recipe = load_recipe(DEVEL_RECIPE)
    sections, seconds = run_devel_checks(engine, devel_image, recipe, wheels, timeout=5400, qemu_cpu=QEMU_CPU)
    report("arm64_devel_checks_seconds", round(seconds, 1))
    return sections


def test_the_devel_image_is_arm64_with_the_toolkit_laid_out_for_sbsa(
    engine: Buildah, devel_image: str, devel_checks: dict[str, list]
) -> None:
    assert architecture(engine, devel_image) == "arm64"
    (layout,) = devel_checks["layout"]
    # nothing missing: targets/sbsa-linux/include/cuda_runtime.h among the files (nvcc.profile's _TARGET_DIR_)
    assert layout["cuda"] == "/usr/local/cuda-13.0" and layout["missing"] == "", layout
    assert layout["stub_soname"] == "libcuda.so.1" and layout["libcuda_on_loader_path"] == 0


def test_nvcc_in_the_arm64_image_builds_every_arch_and_the_test_extension(
    devel_checks: dict[str, list],
) -> None:
    """nvcc (NVIDIA's aarch64 binary, run by qemu) compiles and links for each arch of the recipe; CMake finds
    the toolkit, cuDNN and NCCL; MAGMA builds; the CUDA test extension builds against upstream's aarch64 torch,
    the second build all from the compiler cache."""
    recipe = load_recipe(DEVEL_RECIPE)
    (nvcc,) = devel_checks["nvcc"]
    want = {"sm_" + a.replace(".", "") for a in recipe.accelerator.arch_list}
    assert set(nvcc["cubins"].split()) == want and nvcc["targets"] == len(want)
    assert nvcc["runs"] == "cudaErrorInsufficientDriver"  # linked against cudart; no driver here
    (cmake,) = devel_checks["cmake"]
    versions = dict(item.split(" ") for item in cmake["versions"].strip(";").split(";"))
    assert versions["cudart"] == "13000" and versions["cudnn"] == "9.20.0" and versions["nccl"] == "22907"
    assert cmake["driver_needed"] == "libcuda.so.1"
    (magma,) = devel_checks["magma"]
    assert magma == {"getrf_recnb_16": 1, "potrf_recnb": 32, "zgetrf_kernel": 2}
    first, second = devel_checks["ext"]
    assert first["nvcc_through_ccache"] and first["hits"] == 0 and first["misses"] >= 4
    assert (second["hits"], second["misses"], second["uncacheable"]) == (first["misses"], 0, 0)
    assert first["probe"] == ["13.0", "35"]  # upstream's aarch64 cu130 torch; no driver here: 35


def test_the_arm64_runtime_image_passes_verify_against_upstreams_aarch64_recipe(
    engine: Buildah, storage_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # the devel image, when the tests above made it, is checked by now: free its storage first
    engine.remove_image(image_tag(load_recipe(DEVEL_RECIPE), "devel"))
    recipe = load_recipe(REFERENCE)
    dist = upstream_pair(tmp_path_factory.mktemp("arm64-dist"))
    manifest_for_upstream(recipe, dist, f"the package index ({' '.join(PAIR)}, {AARCH64_WHEELS})")
    start = time.monotonic()
    assert cli_build(storage_root, REFERENCE, "--target", "runtime", "--dist", str(dist)) == 0
    build_seconds = time.monotonic() - start
    image = image_tag(recipe, "runtime")
    assert image.endswith(":2.13.0-cu130-arm64-runtime") and architecture(engine, image) == "arm64"
    probe = engine.run(
        image,
        ["sh", "-c", "uname -m; command -v gcc nvcc || echo no-compiler; python -c 'import torch; "
         "print(torch.__version__, torch.version.cuda)'"],
        capture=True,
        qemu_cpu=QEMU_CPU,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split("\n")[:3] == ["aarch64", "no-compiler", "2.13.0+cu130 13.0"], probe.stdout

    start = time.monotonic()
    areas = [arg for area in arm64root.AREAS_BUT_DDP for arg in ("--area", area)]
    verify = engine.run(
        image,
        ["python", "-m", "torchkiln", "verify", "--recipe", "/opt/torchkiln/recipe.toml",
         "--manifest", "/opt/torchkiln/manifest.json", *areas],
        capture=True,
        timeout=3600,
        qemu_cpu=QEMU_CPU,
    )  # fmt: skip
    verify_seconds = time.monotonic() - start
    summary = verify.stdout.strip().splitlines()[-1] if verify.stdout.strip() else ""
    report(
        "arm64_runtime",
        {"seconds": round(build_seconds, 1), "verify_seconds": round(verify_seconds, 1), "verify": summary},
    )
    assert verify.returncode == 0, verify.stdout[-8000:] + verify.stderr[-3000:]
    assert "failed" not in summary and "passed" in summary, summary
    print(
        f"arm64 runtime image: built in {build_seconds:.0f} s, verify {verify_seconds:.0f} s: {summary}",
        file=sys.stderr,
    )
