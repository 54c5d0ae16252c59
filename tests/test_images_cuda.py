"""Real CUDA 13.0 images with buildah on the debootstrapped Debian bookworm base, no NVIDIA registry: the
toolkit, cuDNN and NCCL come from NVIDIA's PyPI wheels (``--cuda-from pypi``, the default).

* the devel image of tests/data/cu130-devel-test.toml (upstream's cu130 pins on bookworm's Python 3.11 and
  gcc 12), and inside it (tests/data/cuda_devel_checks.sh, one container): the toolkit's layout, nvcc
  compiling and linking a kernel for every arch of the recipe, a CMake project finding the toolkit, cuDNN and
  NCCL as PyTorch's build does (with the plan's environment), MAGMA built as PyTorch builds it on a MAGMA-shaped
  tree, a CUDA extension built twice through ccache (hits on the rebuild) against upstream's cu130 torch;
* the runtime image of the reference recipe with upstream's torch 2.13.0+cu130 and torchvision 0.28.0+cu130
  standing in for dist/ (with the manifest tests/kit/dists.manifest_for_upstream writes for them, which says they
  were downloaded, not built): the wheels' own NVIDIA dependencies from the index, no compiler, no nvcc; the
  verify suite runs in it as the non-root user against the reference recipe and that manifest.

Sizes and times go to .torchkiln/images-report.json. The two images need about 10 GB of vfs storage at once
at most, less on overlay (imagekit.storage_driver): the devel image is removed before the runtime image is
built.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kit import ROOT
from kit.dists import manifest_for_upstream
from kit.imagekit import REPORT as REPORT_FILE
from kit.imagekit import cli_build, report, require, say, stored_size
from kit.imagekit import devel_checks as run_devel_checks

from torchkiln.images.engines import Buildah
from torchkiln.images.spec import image_tag
from torchkiln.process import runner
from torchkiln.recipe.loader import load_recipe

pytestmark = [pytest.mark.buildah, pytest.mark.slow, pytest.mark.usefixtures("own_images")]

DEVEL_RECIPE = ROOT / "tests" / "data" / "cu130-devel-test.toml"
REFERENCE = ROOT / "tests" / "reference" / "recipes" / "upstream-2.13.0-cu130-py311.toml"
# upstream's PyPI wheels of the reference recipe: "===" takes the index's 2.13.0 (+cu130) exactly, not a
# local +cpu build of the same release.
UPSTREAM = ("torch===2.13.0", "torchvision===0.28.0")


@pytest.fixture(scope="module")
def upstream_wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torch 2.13.0+cu130 and torchvision 0.28.0+cu130 for cp311 from the package index (pip's cache makes a
    second session quick)."""
    dest = tmp_path_factory.mktemp("upstream-wheels")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(dest), *UPSTREAM],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    require(done.returncode == 0, f"cannot download {' '.join(UPSTREAM)}: {done.stderr[-500:]}")
    names = sorted(p.name for p in dest.glob("*.whl"))
    assert [n.split("-")[:2] for n in names] == [["torch", "2.13.0"], ["torchvision", "0.28.0"]], names
    return dest


@pytest.fixture(scope="module")
def devel_image(engine: Buildah, base_image: str) -> str:
    start = time.monotonic()
    assert cli_build(engine, DEVEL_RECIPE, "--target", "devel") == 0
    seconds = time.monotonic() - start
    image = image_tag(load_recipe(DEVEL_RECIPE), "devel")
    size, base = stored_size(engine, image), stored_size(engine, base_image)
    report("cuda_devel", {"seconds": round(seconds, 1), "bytes": size, "base_bytes": base})
    return image


def test_cuda_devel_image_builds_from_pypi_on_a_plain_debian_base(
    engine: Buildah, devel_image: str, base_image: str, capsys: pytest.CaptureFixture[str]
) -> None:
    def layers(image: str) -> list[str]:
        inspect = runner.run(engine.command("inspect", "--type", "image", image))
        assert inspect.ok, inspect.describe()
        return json.loads(inspect.stdout)["Docker"]["rootfs"]["diff_ids"]

    # the debootstrapped Debian base and one layer on it: toolchain, toolkit, cuDNN/NCCL together (vfs stores
    # a full copy per layer)
    base_layers, devel_layers = layers(base_image), layers(devel_image)
    assert devel_layers[: len(base_layers)] == base_layers and len(devel_layers) == len(base_layers) + 1
    data = json.loads(REPORT_FILE.read_text())["cuda_devel"]
    say(
        capsys,
        f"CUDA devel image {devel_image}: {data['bytes'] / 1e6:.0f} MB (base {data['base_bytes'] / 1e6:.0f} MB), "
        f"built in {data['seconds']:.0f} s",
    )


@pytest.fixture(scope="module")
def devel_checks(engine: Buildah, devel_image: str, upstream_wheels: Path) -> dict[str, list[dict]]:
    """tests/data/cuda_devel_checks.sh in one container of the devel image (imagekit.devel_checks)."""
    sections, seconds = run_devel_checks(
        engine, devel_image, load_recipe(DEVEL_RECIPE), upstream_wheels, timeout=3000
    )
    report("cuda_devel_checks_seconds", round(seconds, 1))
    return sections


def test_toolkit_from_pypi_is_laid_out_like_an_installed_toolkit(devel_checks: dict[str, list[dict]]) -> None:
    (layout,) = devel_checks["layout"]
    assert layout["cuda"] == "/usr/local/cuda-13.0" and layout["missing"] == ""
    # libcuda.so for the linker only: the stub records the driver's soname and is not on the loader's path
    assert layout["stub_soname"] == "libcuda.so.1" and layout["libcuda_on_loader_path"] == 0


def test_nvcc_compiles_and_links_for_every_arch_of_the_recipe(devel_checks: dict[str, list[dict]]) -> None:
    (nvcc,) = devel_checks["nvcc"]
    want = {"sm_" + a.replace(".", "") for a in load_recipe(DEVEL_RECIPE).accelerator.arch_list}
    assert set(nvcc["cubins"].split()) == want and nvcc["targets"] == len(want)
    assert nvcc["runs"] == "cudaErrorInsufficientDriver"  # linked against cudart; no driver here


def test_cmake_finds_the_toolkit_cudnn_and_nccl_as_pytorch_does(devel_checks: dict[str, list[dict]]) -> None:
    (cmake,) = devel_checks["cmake"]
    versions = dict(item.split(" ") for item in cmake["versions"].strip(";").split(";"))
    recipe = load_recipe(DEVEL_RECIPE)
    assert versions["cudart"] == "13000" and versions["cublas"] == "13"
    assert versions["cudnn"] == ".".join(str(recipe.accelerator.cudnn).split(".")[:3])
    major, minor, patch = (int(x) for x in str(recipe.accelerator.nccl).split("."))
    assert versions["nccl"] == str(major * 10000 + minor * 100 + patch)
    assert cmake["driver_needed"] == "libcuda.so.1"  # CUDA::cuda_driver exists and links the stub


def test_magma_builds_as_pytorch_builds_it(devel_checks: dict[str, list[dict]]) -> None:
    """install_magma.sh on tests/data/magma_shape: edited (CUDA 13 clockRate guard, no Fermi kernels, no
    exceptions), compiled for the recipe's -gencode list, a static PIC libmagma.a with PyTorch's batched-LU
    settings."""
    (magma,) = devel_checks["magma"]
    assert magma == {"getrf_recnb_16": 1, "potrf_recnb": 32, "zgetrf_kernel": 2}


def test_cuda_extension_builds_through_the_compiler_cache(devel_checks: dict[str, list[dict]]) -> None:
    first, second = devel_checks["ext"]
    assert first["nvcc_through_ccache"] and first["hits"] == 0 and first["misses"] >= 4  # 3 C++ + 1 CUDA
    assert (second["hits"], second["misses"], second["uncacheable"]) == (first["misses"], 0, 0)
    assert first["so"] == second["so"] and len(first["so"]) == 1
    # built against upstream's cu130 torch; its kernel launch reaches the CUDA runtime (no driver here: 35)
    assert first["probe"] == ["13.0", "35"]


def test_cuda_runtime_image_runs_upstream_torch_and_passes_the_verify_suite(
    engine: Buildah,
    base_image: str,
    devel_image: str,
    devel_checks: dict[str, list[dict]],
    upstream_wheels: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The devel image has been checked: free its storage before the runtime image needs its own.
    engine.remove_image(devel_image)
    assert not engine.image_exists(devel_image)
    recipe = load_recipe(REFERENCE)
    # upstream's wheels stand in for a build of the reference recipe: a manifest that says so
    manifest_for_upstream(recipe, upstream_wheels, f"the package index ({' '.join(UPSTREAM)})")
    start = time.monotonic()
    assert cli_build(engine, REFERENCE, "--target", "runtime", "--dist", str(upstream_wheels)) == 0
    build_seconds = time.monotonic() - start
    image = image_tag(recipe, "runtime")

    probe = engine.run(
        image,
        [
            "sh",
            "-c",
            "id -un; for t in gcc g++ cc c++ nvcc; do command -v $t || echo no-$t; done; "
            "ls /usr/local | grep -c cuda || true; du -sb /opt/venv | cut -f1; "
            "python -c 'import torch, torchvision; print(torch.__version__, torchvision.__version__, "
            "torch.version.cuda, torch.backends.cudnn.version())'",
        ],
        capture=True,
    )
    assert probe.returncode == 0, probe.stderr
    lines = probe.stdout.split("\n")
    assert lines[0] == "kiln"
    assert lines[1:6] == ["no-gcc", "no-g++", "no-cc", "no-c++", "no-nvcc"]
    assert lines[6] == "0"  # no /usr/local/cuda*: the CUDA libraries are the wheels' dependencies
    venv_bytes = int(lines[7])
    assert lines[8].split() == ["2.13.0+cu130", "0.28.0+cu130", "13.0", "92000"]

    config = engine.image_config(image)
    assert config.user == "10001:10001"
    assert config.labels["io.torchkiln.cuda"] == "13.0"
    # the version the manifest lists: the wheel's (PyPI's wheel metadata has no local label; torch.__version__
    # has), and the commit it records for the source (the one the wheel's version.py names)
    assert config.labels["io.torchkiln.torch-version"] == "2.13.0"
    assert config.labels["io.torchkiln.torch-commit"] == recipe.torch.commit

    size, base = stored_size(engine, image), stored_size(engine, base_image)
    assert size <= base + venv_bytes + 150e6, (size, base, venv_bytes)
    measured = {
        "seconds": round(build_seconds, 1),
        "bytes": size,
        "base_bytes": base,
        "venv_bytes": venv_bytes,
    }
    report("cuda_runtime", measured)  # before the suite runs: the numbers are kept whatever it finds

    start = time.monotonic()
    verify = engine.run(
        image,
        [
            "python", "-m", "torchkiln", "verify",
            "--recipe", "/opt/torchkiln/recipe.toml", "--manifest", "/opt/torchkiln/manifest.json",
        ],
        capture=True,
        timeout=1800,
    )  # fmt: skip
    verify_seconds = time.monotonic() - start
    summary = verify.stdout.strip().splitlines()[-1] if verify.stdout.strip() else ""
    assert verify.returncode == 0, verify.stdout[-8000:] + verify.stderr[-3000:]
    assert "failed" not in summary and "passed" in summary, summary

    report("cuda_runtime", {**measured, "verify_seconds": round(verify_seconds, 1), "verify": summary})
    say(
        capsys,
        f"CUDA runtime image {image}: {size / 1e6:.0f} MB = base {base / 1e6:.0f} MB + venv "
        f"{venv_bytes / 1e6:.0f} MB + {(size - base - venv_bytes) / 1e6:.0f} MB; built in {build_seconds:.0f} s, "
        f"verify {verify_seconds:.0f} s: {summary}",
    )
