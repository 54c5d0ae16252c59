"""linux/arm64 images built on this x86_64 machine, their RUN steps through qemu-user (issue 22): `nox -s
aarch64` runs this module in full (TORCHKILN_ARM64_FULL=1); `pytest tests/test_images_arm64.py` in its quick
form. Not in CI's tests session (about 14 of its minutes; it builds the same images for x86_64: docs/aarch64.md).

* the runtime image of the aarch64 reference recipe (tests/reference/recipes/upstream-2.13.0-cu130-py311-
  aarch64.toml), upstream's aarch64 torch 2.13.0 / torchvision 0.28.0 standing in for dist/
  (tests/kit/dists.manifest_for_upstream), and inside it the reference run: ``torchkiln verify`` against that recipe
  (GPU checks skipped with their reason) and the one-field controls, each failing by its name, with upstream's
  x86_64 recipe failing by build.platform;
* the devel image of tests/data/cu130-aarch64-devel-test.toml (`torchkiln images --target devel`, Debian
  bookworm arm64 made by ``debootstrap --arch=arm64``, the toolkit, cuDNN and NCCL from NVIDIA's aarch64 PyPI
  wheels laid out for sbsa-linux), and inside it tests/data/cuda_devel_checks.sh as for x86_64: nvcc (NVIDIA's
  aarch64 binary, emulated) compiling and linking a kernel, and the CUDA test extension built twice through
  ccache against upstream's aarch64 torch.

What the quick form runs and what only the full run does (measured times in docs/aarch64.md):

=====================  ==========================================  ==========================================
                       quick (pytest of this module)               full (`nox -s aarch64`)
=====================  ==========================================  ==========================================
verify areas           build_config, cuda_visibility, release      every area but ddp (tests/aarch64 runs one
                                                                   DDP launch)
devel checks           layout, nvcc, ext (built once, its binding  layout, nvcc, cmake, magma, ext (twice:
                       on torch's pybind11 header); 9.0 and 10.0   the second from the cache; <torch/
                       (GH200, GB200)                              extension.h>); five archs
=====================  ==========================================  ==========================================

Both images are built at once (two ``torchkiln images`` processes on one storage, after the arm64 base):
each is one emulated, mostly single-threaded pip or apt at a time, so two cores build them in about the time
of the longer one. pip in the images reads PyPI through a mirror on this machine (tests/kit/pypimirror.py,
``--pip-config``): under emulation TLS costs pip 200 s for these wheels. The storage is overlay where the
kernel mounts one (imagekit.storage_driver; vfs copies every layer whole), else vfs.

Every run in the images hides the host's CPUs from torch (Engine.run(qemu_cpu=...): engines.HOST_CPUS;
without that, upstream's aarch64 torch dies at import under qemu). A real torch compile under emulation would
take days and is not tried. Times go to .torchkiln/images-report.json.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kit import ROOT, arm64root, pypimirror, realtrees
from kit.dists import manifest_for_upstream
from kit.imagekit import HOST_CAS, cli_argv, private_buildah, remove_all, report, require
from kit.imagekit import devel_checks as run_devel_checks

from torchkiln.images import rootfs
from torchkiln.images.engines import Buildah
from torchkiln.images.platforms import platform_named
from torchkiln.images.spec import image_tag
from torchkiln.process.logs import first_error, tail
from torchkiln.recipe.image_bases import DISTROS
from torchkiln.recipe.loader import load_recipe

# Emulated: the two images and their checks take about 10 minutes here in the quick form, more in full; pytest-timeout's
# default is 900 s.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(5400)]

FULL = os.environ.get("TORCHKILN_ARM64_FULL") == "1"
DEVEL_RECIPE = ROOT / "tests" / "data" / "cu130-aarch64-devel-test.toml"
REFERENCE = ROOT / "tests" / "reference" / "recipes" / "upstream-2.13.0-cu130-py311-aarch64.toml"
X86_REFERENCE = ROOT / "tests" / "reference" / "recipes" / "upstream-2.13.0-cu130-py311.toml"
PAIR = ("torch===2.13.0", "torchvision===0.28.0")
AARCH64_WHEELS = "manylinux_2_28_aarch64"
# qemu modelling Grace's 128-bit SVE (data/compat.toml qemu_cpu): at qemu's default NVPL's sgemm is wrong
QEMU_CPU = platform_named("aarch64").qemu_cpu
# Debian bookworm arm64, the base of both recipes' images (Python 3.11), as `--base-from debootstrap` tags it
BASE = rootfs.plan_debootstrap(
    "debian12", DISTROS["debian12"], archive=None, cas=HOST_CAS, target=platform_named("aarch64")
)
AREAS = arm64root.AREAS_BUT_DDP if FULL else ("build_config", "cuda_visibility", "release")
# CI: nvcc and the extension for the two Grace machines' archs, GH200's and GB200's (the arch list is the
# build's environment, not the image's; two, since nvcc names a lone target's cubin without its arch), the
# extension built once (the second build, all from the compiler cache, is the full run's; on x86_64 CI's),
# its binding unit on torch's pybind11 header instead of <torch/extension.h> (tests/data/cache_ext/setup.py:
# 326 s of the emulated build were that header through qemu's cc1plus; natively the build takes 12 s, not 39)
CHECKS = (
    {}
    if FULL
    else {
        "KILN_CHECKS": "layout nvcc ext",
        "TORCH_CUDA_ARCH_LIST": "9.0;10.0",
        "KILN_EXT_BUILDERS": "first",
        "KILN_CACHE_EXT_BINDINGS_ONLY": "1",
    }
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Buildah]:
    """buildah on the module's own storage (imagekit.private_buildah), qemu registered for its RUN steps; its
    containers and images are removed when the module ends."""
    found = arm64root.problems()
    require(not found, "; ".join(found))
    require(shutil.which("buildah") is not None, "buildah is not installed (apt-get install buildah)")
    arm64root.register_qemu()
    engine = private_buildah(tmp_path_factory.mktemp("buildah-arm64"))
    report("arm64_storage_driver", engine.storage.driver)
    yield engine
    remove_all(engine)


def architecture(engine: Buildah, image: str) -> str:
    done = subprocess.run(
        engine.command("inspect", "--type", "image", "--", image), capture_output=True, text=True, check=True
    )
    return str(json.loads(done.stdout)["Docker"]["architecture"])


def upstream_pair(dest: Path) -> Path:
    """Upstream's aarch64 torch/torchvision for cp311 (the test cache keeps them)."""
    for requirement in PAIR:
        wheel = realtrees.pypi_wheel(requirement, python_version="3.11", platform=AARCH64_WHEELS)
        shutil.copy(wheel, dest / wheel.name)
    return dest


def images_argv(engine: Buildah, pip_config: Path, recipe: Path, *args: str) -> list[str]:
    """``torchkiln images`` for ``recipe`` as a process of its own, on the module's storage, pip through the
    mirror."""
    return [
        sys.executable,
        "-m",
        "torchkiln",
        *cli_argv(engine, recipe, "--pip-config", str(pip_config), *args),
    ]


def build(argv: list[str], log: Path) -> float:
    """One ``torchkiln images`` run, its output in ``log``; its seconds."""
    start = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=5400, check=False)
    assert done.returncode == 0, failure(log)
    return round(time.monotonic() - start, 1)


def failure(log: Path) -> str:
    """A failed build's story, the cause first (a CI log keeps the start of a long message): the line that
    names why (torchkiln's own ranking of log lines, a full disk among the causes) and the disk left (an
    image's layers take gigabytes), then the log's tail."""
    free = shutil.disk_usage(log.parent).free / 2**30
    cause = first_error(log) or "(no line names a cause)"
    return "\n".join([f"{log.name} failed ({free:.1f} GiB free on {log.parent}): {cause}", *tail(log, 60)])


def devel_pipeline(engine: Buildah, argv: list[str], log: Path, wheels: Path, index: str) -> dict[str, Any]:
    """The devel image, then tests/data/cuda_devel_checks.sh in it, emulated, with upstream's aarch64 torch
    from ``wheels`` (the checks' own pip installs read the mirror too)."""
    built = build(argv, log)
    recipe = load_recipe(DEVEL_RECIPE)
    sections, seconds = run_devel_checks(
        engine,
        image_tag(recipe, "devel"),
        recipe,
        wheels,
        timeout=5400,
        qemu_cpu=QEMU_CPU,
        extra_env={"PIP_INDEX_URL": index, "PIP_TRUSTED_HOST": "127.0.0.1", **CHECKS},
    )
    return {"sections": sections, "build_seconds": built, "checks_seconds": round(seconds, 1)}


@dataclass
class Images:
    runtime: str
    runtime_log: Path  # what its build printed
    dist: Path  # the wheels it was built from
    devel: str
    devel_done: Future[dict[str, Any]]  # devel_pipeline's result


@pytest.fixture(scope="module")
def images(engine: Buildah, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Images]:
    """The base first (both images start FROM it), then two pipelines at once: the devel image and its checks
    in a thread, the runtime image here, niced (the devel pipeline is the longer one). Each is one emulated,
    mostly single-threaded step at a time, so two cores run both in about the time of the longer. The runtime
    tests run while the devel checks go on (this module's runtime tests come first)."""
    work = tmp_path_factory.mktemp("arm64-images")
    dist = upstream_pair(tmp_path_factory.mktemp("arm64-dist"))
    manifest_for_upstream(
        load_recipe(REFERENCE), dist, f"the package index ({' '.join(PAIR)}, {AARCH64_WHEELS})"
    )
    wheels = tmp_path_factory.mktemp("arm64-torch")
    shutil.copy(next(dist.glob("torch-*.whl")), wheels)
    mirror = pypimirror.mirror(realtrees.cache_dir() / "pypi-mirror", work / "mirror.log")
    with mirror as index, ThreadPoolExecutor(max_workers=1) as pool:
        pip_config = pypimirror.pip_config(index, work / "pip.conf")
        start = time.monotonic()
        # the base both start FROM, made first by the step `--base-from debootstrap` runs (the CLI then finds
        # it by its tag): two builds making it at once would both run debootstrap
        rootfs.ensure(engine, BASE)
        report("arm64_base_seconds", round(time.monotonic() - start, 1))
        devel = images_argv(
            engine, pip_config, DEVEL_RECIPE, "--target", "devel", "--platform", "linux/arm64"
        )
        devel_done = pool.submit(devel_pipeline, engine, devel, work / "devel.log", wheels, index)
        runtime = images_argv(engine, pip_config, REFERENCE, "--target", "runtime", "--dist", str(dist))
        runtime_log = work / "runtime.log"
        report("arm64_runtime_seconds", build(["nice", "-n", "10", *runtime], runtime_log))
        yield Images(
            image_tag(load_recipe(REFERENCE), "runtime"),
            runtime_log,
            dist,
            image_tag(load_recipe(DEVEL_RECIPE), "devel"),
            devel_done,
        )


@pytest.fixture(scope="module")
def devel_checks(images: Images) -> dict[str, list]:
    done = images.devel_done.result(timeout=5400)
    report("arm64_devel_seconds", {"build": done["build_seconds"], "checks": done["checks_seconds"]})
    return dict(done["sections"])


def test_the_arm64_runtime_image_is_upstreams_pair_without_a_compiler(
    engine: Buildah, images: Images
) -> None:
    image = images.runtime
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
    # the pair from the dist/ mount, not from the index, which has the very same files (pip, given both,
    # took the index's); pip's own lines in the build's output say which it installed
    pip_said = images.runtime_log.read_text().splitlines()
    for wheel in (f.name for f in images.dist.glob("*.whl")):
        assert any(
            line.strip().startswith("Processing ") and f"mnt/dist/{wheel}" in line for line in pip_said
        )
        assert not [line for line in pip_said if "Downloading " in line and wheel in line], wheel


def test_the_reference_run_in_the_arm64_runtime_image(
    engine: Buildah, images: Images, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """verify against upstream's aarch64 recipe passes (the recipe compared field by field: platform, BLAS,
    arch list among them; the GPU checks skipped with their reason); then each one-field control fails by its
    field and upstream's x86_64 recipe by build.platform, as the x86_64 reference tier's controls do."""
    # the image's mounts are read-only: the report goes to the container's /tmp, its summary to stdout
    areas = " ".join(f"--area {area}" for area in AREAS)
    start = time.monotonic()
    verify = engine.run(
        images.runtime,
        ["sh", "-c", "python -m torchkiln verify --recipe /opt/torchkiln/recipe.toml --manifest "
         f"/opt/torchkiln/manifest.json --report /tmp/report {areas}; status=$?; echo; echo SUMMARY "
         "$(tr -d '\\n' < /tmp/report/summary.json); exit $status"],
        capture=True,
        timeout=3600,
        qemu_cpu=QEMU_CPU,
    )  # fmt: skip
    verify_seconds = time.monotonic() - start
    assert verify.returncode == 0, verify.stdout[-8000:] + verify.stderr[-3000:]
    summary = json.loads(verify.stdout.split("\nSUMMARY ", 1)[1].splitlines()[0])
    checks = summary["checks"]
    assert summary["ok"] and not [c for c in checks if c["outcome"] == "failed"], verify.stdout[-4000:]
    passed = {c["nodeid"].split("::", 1)[1] for c in checks if c["outcome"] == "passed"}
    for name in ("platform", "blas", "arch_list", "magma", "cuda_version", "cudnn", "nccl"):
        assert f"test_build_matches_recipe[{name}]" in passed, (name, sorted(passed))
    assert summary["totals"]["skipped_no_gpu"] > 0
    assert any("no device is usable" in c["message"] for c in checks if c["outcome"] == "skipped")

    start = time.monotonic()
    controls = tmp_path_factory.mktemp("arm64-controls")
    script, recipes = arm64root.write_controls(controls, REFERENCE, X86_REFERENCE)
    controls.chmod(0o755)  # the image runs as kiln (uid 10001); pytest makes its directories 0700
    seen = {name: f"/mnt/controls/{path.name}" for name, path in recipes.items()}
    done = engine.run(
        images.runtime,
        ["python", f"/mnt/controls/{script.name}", *seen.values()],
        mounts={controls: "/mnt/controls"},
        capture=True,
        timeout=1800,
        qemu_cpu=QEMU_CPU,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    arm64root.check_controls(done.stdout, seen)
    report(
        "arm64_reference_run",
        {
            "areas": list(AREAS),
            "verify_seconds": round(verify_seconds, 1),
            "totals": summary["totals"],
            "controls_seconds": round(time.monotonic() - start, 1),
        },
    )


def test_the_devel_image_is_arm64_with_the_toolkit_laid_out_for_sbsa(
    engine: Buildah, images: Images, devel_checks: dict[str, list]
) -> None:
    assert architecture(engine, images.devel) == "arm64"
    (layout,) = devel_checks["layout"]
    # nothing missing: targets/sbsa-linux/include/cuda_runtime.h among the files (nvcc.profile's _TARGET_DIR_)
    assert layout["cuda"] == "/usr/local/cuda-13.0" and layout["missing"] == "", layout
    assert layout["stub_soname"] == "libcuda.so.1" and layout["libcuda_on_loader_path"] == 0


def test_nvcc_in_the_arm64_image_builds_the_test_extension(devel_checks: dict[str, list]) -> None:
    """nvcc (NVIDIA's aarch64 binary, run by qemu) compiles and links a kernel for each arch asked for; the CUDA
    test extension builds against upstream's aarch64 torch, its CUDA unit through nvcc and ccache. In full, a
    second build comes all from the compiler cache, CMake finds the toolkit, cuDNN and NCCL, and MAGMA builds."""
    archs = CHECKS.get("TORCH_CUDA_ARCH_LIST") or ";".join(load_recipe(DEVEL_RECIPE).accelerator.arch_list)
    (nvcc,) = devel_checks["nvcc"]
    want = {"sm_" + a.replace(".", "") for a in archs.split(";")}
    assert set(nvcc["cubins"].split()) == want and nvcc["targets"] == len(want)
    assert nvcc["runs"] == "cudaErrorInsufficientDriver"  # linked against cudart; no driver here
    first, *again = devel_checks["ext"]
    assert first["nvcc_through_ccache"] and first["hits"] == 0 and first["misses"] >= 4  # 3 C++ + 1 CUDA
    assert first["probe"] == ["13.0", "35"]  # upstream's aarch64 cu130 torch; no driver here: 35
    assert len(first["so"]) == 1 and first["so"][0].endswith(".so")
    report("arm64_ext_seconds", [build["seconds"] for build in devel_checks["ext"]])
    if FULL:
        (second,) = again
        assert (second["hits"], second["misses"], second["uncacheable"]) == (first["misses"], 0, 0)
        (cmake,) = devel_checks["cmake"]
        versions = dict(item.split(" ") for item in cmake["versions"].strip(";").split(";"))
        assert versions["cudart"] == "13000" and versions["cudnn"] == "9.20.0" and versions["nccl"] == "22907"
        assert cmake["driver_needed"] == "libcuda.so.1"
        (magma,) = devel_checks["magma"]
        assert magma == {"getrf_recnb_16": 1, "potrf_recnb": 32, "zgetrf_kernel": 2}
    else:
        assert "cmake" not in devel_checks and "magma" not in devel_checks and not again
