"""nox sessions: thin wrappers around the torchkiln library and CLI.

``nox`` alone runs the default sessions (lint, tests, readme, verify, reference): the command README.md and
.ci/run give.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests", "readme", "verify", "reference"]
# The two parts of torchkiln's own tests: unit tests (seconds each, under 2 minutes together) and integration
# tests (real compiles, servers, image builds, pip into fresh venvs). `nox -s unit` runs the first alone.
INTEGRATION = "integration or slow"
DURATIONS = "--durations=15"
nox.options.reuse_existing_virtualenvs = True
nox.options.default_venv_backend = "venv"

ROOT = Path(__file__).parent
sys.path.insert(0, str(ROOT / "src"))  # torchkiln.nox_support: stdlib + nox only
# The torch the test suite runs against: the CPU wheel available to CI (override with TORCHKILN_TORCH).
TORCH_REQUIREMENT = os.environ.get("TORCHKILN_TORCH", "torch==2.13.0")
# The reference tier: upstream's own CUDA 13.0 builds from PyPI, each with the recipe that describes it.
# `torch===2.13.0` (three '='): an exact match, so pip takes upstream's 2.13.0 (+cu130 inside), not a
# local 2.13.0+cpu wheel that `==` would also accept.
REFERENCE_DIR = ROOT / "tests" / "reference"
# README.md in fresh debootstrap roots: `nox -s readme` (default: Debian 12 and 13, as root) and `nox -s newcomer`
# (not a default session: Debian 12, 13 and 14, as root and as a user, the first build too).
NEWCOMER_DIR = ROOT / "tests" / "newcomer"
# The aarch64 proof in an arm64 root under qemu-user, and the linux/arm64 images: `nox -s aarch64` only (not a
# default session). The arm64 images are the platform matrix's emulated entry: about 14 of CI's minutes on 2
# cores (each image one mostly single-threaded emulated pip or apt), where the tests session builds the same
# images for x86_64 natively.
AARCH64_DIR = ROOT / "tests" / "aarch64"
ARM64_IMAGES = ROOT / "tests" / "test_images_arm64.py"
# Every session's first install: a venv's own pip is whatever the Python's ensurepip bundles (Debian 12's venv
# pip is 23.0.1), and the tests need pip >= 23.1: it records the sha256 of a local wheel it installs in
# direct_url.json (verify's wheel_sha256 check reads it; tests/test_manifest.py) and takes --python-version
# without --target (--torch's dry run). 24 is what the reference tier already asked for.
PIP = "pip>=24"
# Every release in data/compat.toml: upstream's default x86_64 wheel on PyPI (plain `pip install torch`), the
# latest patch of each minor, with the newest torchvision of the paired minor (0.(N+15)) built with the same
# CUDA: 0.29.1+cu130 for 2.14.1+cu130 (0.29.2 is +cu132; from 0.29 torchvision requires torch>=2.14.0, built
# on its stable ABI). `torch===` (three '='): an exact match, so pip takes upstream's CUDA build, not a local
# +cpu wheel `==` would also accept. `nox -s releases` runs them all (not a default session). torch 2.15.0
# pairs with 0.29.2+cu132: no 0.30 was released; 0.29.2 was built the day 2.15.0 was, with its CUDA 13.2
# (data/compat.toml's 2.15 row names the source).
RELEASE_PAIRS = {
    "2.6.0": ("torch===2.6.0", "torchvision==0.21.0"),
    "2.7.1": ("torch===2.7.1", "torchvision==0.22.1"),
    "2.8.0": ("torch===2.8.0", "torchvision==0.23.0"),
    "2.9.1": ("torch===2.9.1", "torchvision==0.24.1"),
    "2.10.0": ("torch===2.10.0", "torchvision==0.25.0"),
    "2.11.0": ("torch===2.11.0", "torchvision==0.26.0"),
    "2.12.1": ("torch===2.12.1", "torchvision==0.27.1"),
    "2.13.0": ("torch===2.13.0", "torchvision==0.28.0"),
    "2.14.1": ("torch===2.14.1", "torchvision==0.29.1"),
    "2.15.0": ("torch===2.15.0", "torchvision==0.29.2"),
}
# CI's reference tier keeps a spread of them: 2.8.0 (CUDA 12.8, compiled against cuDNN 9.8.0 but shipping
# 9.10.2.21; get_arch_list() is [] without a GPU), 2.13.0 (the last setup.py build, CUDA 13.0, C++20; the
# --compare-with run) and 2.15.0 (scikit-build-core, torchvision 0.29.2 on torch's stable ABI, a library the wheel
# needs unbundled: [deploy] system_libraries).
REFERENCE_PAIRS = ("2.8.0", "2.13.0", "2.15.0")
# verify --compare-with on real wheels: the pair's CUDA build against upstream's CPU wheel of the same release
# (`torch==2.13.0` finds 2.13.0+cpu; the venv it is installed into is cached, ~/.cache/torchkiln/compare).
REFERENCE_COMPARE = {"2.13.0": "torch==2.13.0"}


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the code, mypy (strict) over src/torchkiln, the layers of src/torchkiln (import-linter's
    contracts in pyproject.toml), hadolint over the Dockerfiles."""
    session.install(PIP)
    session.install("-e", ".[lint]")
    session.run("ruff", "check", "src", "tests", "verify", "bench", "noxfile.py")
    session.run("ruff", "format", "--check", "src", "tests", "verify", "bench", "noxfile.py")
    session.run("mypy")  # [tool.mypy] in pyproject.toml: strict, files = src/torchkiln
    session.run("lint-imports")  # [tool.importlinter]: a broken layer names the import that broke it
    dockerfiles = sorted(str(p) for p in (ROOT / "docker").glob("Dockerfile*"))
    if dockerfiles:
        session.run("hadolint", "--config", str(ROOT / "docker" / "hadolint.yaml"), *dockerfiles)


@nox.session
def tests(session: nox.Session) -> None:
    """torchkiln's own tests, unit and integration parts (git, compilers, Redis, buildah where present) in one
    pytest run of two processes (pytest-xdist; tests/conftest.py keeps each module in one process and starts the
    longest first), its slowest tests listed. Arguments after ``--`` replace it (one pytest run)."""
    session.install(PIP)
    session.install("-e", ".[test]", TORCH_REQUIREMENT)
    if session.posargs:
        session.run("python", "-m", "pytest", *session.posargs)
        return
    base = [
        "python",
        "-m",
        "pytest",
        "tests",
        "--ignore",
        str(REFERENCE_DIR),
        "--ignore",
        str(NEWCOMER_DIR),
        "--ignore",
        str(AARCH64_DIR),
        "--ignore",
        str(ARM64_IMAGES),
        DURATIONS,
    ]
    # CI's machine has 2 cores, and most tests wait on pip, git, buildah or one compile at a time: two
    # processes keep both busy (87 minutes down to 39 on a 2-core machine, docs/testing.md). More would run more builds at once than their
    # own --jobs expect.
    session.run(*base, "-n", "2", "--no-loadscope-reorder")  # tests/conftest.py's scheduler: by group


@nox.session
def unit(session: nox.Session) -> None:
    """The unit part of the tests alone (under 2 minutes): ``nox -s unit``. It downloads no torch: it takes
    the one this machine's pip already offers without an index (find-links, e.g. CI's /opt/wheels), else
    none, and the tests that run torch skip saying so (under CI=true they fail instead)."""
    session.install(PIP)
    session.install("-e", ".[test]")
    _offered_torch(session)
    session.run(
        "python", "-m", "pytest", "tests", "--ignore", str(REFERENCE_DIR), "--ignore", str(NEWCOMER_DIR),
        "--ignore", str(AARCH64_DIR), DURATIONS, "-m", f"not ({INTEGRATION})",
        *session.posargs,
    )  # fmt: skip


@nox.session(name="unit-pythons", python=["3.10", "3.11", "3.12", "3.13", "3.14"])
def unit_pythons(session: nox.Session) -> None:
    """The unit part on every Python torchkiln supports that this machine has (not a default session; a
    missing interpreter is skipped outside CI): what a host of another Python runs, e.g. Ubuntu 22.04's
    3.10, where ``datetime.UTC`` (3.11) was found in a test."""
    unit(session)


def _offered_torch(session: nox.Session) -> None:
    """TORCH_REQUIREMENT where this machine's pip offers its wheel without an index (``--no-index``: its
    find-links only), with what it requires from the index (a few MB for upstream's CPU wheel); else
    nothing. A torch download is 4.7 GB on a fresh machine (PyPI's is the CUDA build), for a build tool's
    unit tests."""
    local = (
        "import subprocess, sys; print(subprocess.run([sys.executable, '-m', 'pip', 'install', '--quiet', "
    )
    local += f"'--no-index', '--no-deps', {TORCH_REQUIREMENT!r}], capture_output=True).returncode)"
    if str(session.run("python", "-c", local, silent=True)).strip() != "0":
        session.log(f"no {TORCH_REQUIREMENT} offered without a download here: the tests that run torch skip")
        return
    session.install(TORCH_REQUIREMENT)


@nox.session
def verify(session: nox.Session) -> None:
    """Verify a PyTorch build: wheels from dist/ when there are any (and against dist/manifest.json), else
    TORCHKILN_TORCH (torch==2.13.0).

    Arguments after ``--`` go to the suite, e.g. ``nox -s verify -- --recipe recipes/x.toml --report out``.
    """
    from torchkiln.nox_support import install_for_verify, verify_args  # noqa: PLC0415 - needs torchkiln importable

    dist = ROOT / "dist"
    session.install(PIP)
    installed = install_for_verify(session, dist=dist, fallback=TORCH_REQUIREMENT)
    session.run("python", "-m", "torchkiln", "verify", *verify_args(dist, installed, list(session.posargs)))


@nox.session(python="3.11")
@nox.parametrize("pair", list(REFERENCE_PAIRS))
def reference(session: nox.Session, pair: str) -> None:
    """Ground truth: upstream's PyPI torch + torchvision in a fresh venv, verified against the recipe
    `torchkiln recipe describe` wrote of them (committed; the tier checks it still writes the same), every
    GPU-less check passing, then the negative controls (one recipe field changed each: the run must fail
    naming it). See tests/reference/. Its venv is removed at the end (5-6 GB; CI's disk holds one pair at a
    time, not three: a rerun installs again)."""
    _upstream_pair(session, pair, write_recipe=False)
    _remove_venv(session, pair)


@nox.session(python="3.11")
@nox.parametrize("pair", list(RELEASE_PAIRS))
def releases(session: nox.Session, pair: str) -> None:
    """Every release in data/compat.toml (RELEASE_PAIRS), as the reference tier does its pairs: upstream's
    wheels, described, verified, the controls failing by name; then the venv is deleted (5-6 GB each).
    Fails when PyPI has a newer patch of the minor than RELEASE_PAIRS names. TORCHKILN_WRITE_RECIPES=1 writes
    what describe says into tests/reference/recipes/ (how those files are made) instead of comparing."""
    _latest_patch(session, pair)
    _upstream_pair(session, pair, write_recipe=os.environ.get("TORCHKILN_WRITE_RECIPES") == "1")
    _remove_venv(session, pair)


def _remove_venv(session: nox.Session, pair: str) -> None:
    """The pair's venv (5.5 to 6.3 GB of torch and NVIDIA wheels), once its session passed: one pair on disk
    at a time, as CI's disk is finite (the pairs share few files: each its own CUDA's libraries)."""
    venv = Path(session.virtualenv.location)
    session.log(f"removing {venv} ({pair}: done)")
    shutil.rmtree(venv, ignore_errors=True)
    shutil.rmtree(ROOT / ".nox" / ".objects", ignore_errors=True)  # where earlier versions linked their files


def _latest_patch(session: nox.Session, pair: str) -> None:
    """RELEASE_PAIRS names the newest patch of its minor on the index (`pip index versions torch`)."""
    out = session.run(
        "python", "-m", "pip", "index", "versions", "torch", silent=True, external=True
    )  # fmt: skip
    listed = next((line for line in str(out).splitlines() if line.startswith("Available versions:")), "")
    minor = ".".join(pair.split(".")[:2])
    patches = [v.strip() for v in listed.partition(":")[2].split(",") if v.strip().startswith(minor + ".")]
    newest = max((v for v in patches if "+" not in v), key=lambda v: int(v.split(".")[2]), default=pair)
    if newest != pair:
        session.error(f"torch {newest} is on the index: RELEASE_PAIRS's {minor} entry says {pair}")


def _upstream_pair(session: nox.Session, pair: str, *, write_recipe: bool) -> None:
    """Install upstream's pair from its wheel files, describe it, verify it (recipe, manifest, signed
    provenance, --compare-with where REFERENCE_COMPARE says), then tests/reference (controls)."""
    torch_req, vision_req = RELEASE_PAIRS[pair]
    tmp = Path(session.create_tmp())
    # Upstream's wheel files, installed from here and described by a manifest, so verify's provenance checks
    # (--manifest: versions, commits, sha256, installed files) run on them too.
    wheels = tmp / f"wheels-{pair}"
    shutil.rmtree(wheels, ignore_errors=True)
    session.install(PIP)
    session.run(
        "python", "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(wheels), torch_req, vision_req
    )  # fmt: skip
    session.install("-e", ".[test]", *sorted(str(w) for w in wheels.glob("*.whl")))
    version = session.run("python", "-c", "import torch; print(torch.__version__)", silent=True)
    label = str(version).strip().splitlines()[-1].partition("+")[2] or "cpu"
    name = f"upstream-{pair}-{label}-py311"
    recipe = REFERENCE_DIR / "recipes" / f"{name}.toml"
    if write_recipe:
        session.run("python", "-m", "torchkiln", "recipe", "describe", "--name", name, "--out", str(recipe))
    # ... and signed: SBOMs and a provenance statement over them (a key made for this run), so verify's
    # --provenance checks (signature, subjects, byproducts) run on them too.
    keys = tmp / f"keys-{pair}"
    session.run(
        "python", str(ROOT / "tests" / "kit" / "upstream_manifest.py"), str(recipe), str(wheels), "--sign", str(keys)
    )  # fmt: skip
    report_dir = tmp / f"reference-{pair}"
    compare = ["--compare-with", REFERENCE_COMPARE[pair]] if pair in REFERENCE_COMPARE else []
    session.run(
        "python", "-m", "torchkiln", "verify", "--recipe", str(recipe),
        "--manifest", str(wheels / "manifest.json"), "--report", str(report_dir),
        "--provenance", str(wheels / f"{recipe.stem}.intoto.jsonl"), "--key", str(keys / "reference.pub"),
        *compare,
    )  # fmt: skip
    session.log((report_dir / "summary.md").read_text().split("\n## Checks per area")[0])
    session.run(
        "python",
        "-m",
        "pytest",
        str(REFERENCE_DIR),
        *session.posargs,
        env={
            "TORCHKILN_REFERENCE_RECIPE": str(recipe),
            "TORCHKILN_REFERENCE_REPORT": str(report_dir),
            "TORCHKILN_REFERENCE_COMPARE": REFERENCE_COMPARE.get(pair, ""),
        },
    )
    shutil.rmtree(wheels, ignore_errors=True)


# The GPU run (docs/gpu-run.md): scripts/gpu-run.sh on a lent, offline GPU machine whose image has upstream's
# torch 2.11.0+cu130 / torchvision 0.26.0 for Python 3.12. What it installs comes from gpu-wheels/ (gitignored,
# carried along: at most 64 MiB, no torch): torchkiln's own dependencies and the suite's.
GPU_WHEELS = ROOT / "gpu-wheels"
GPU_WHEELS_LIMIT = 64 * 2**20
# Not setuptools (torch.utils.cpp_extension imports it): torch requires it itself, with a bound (2.11.0:
# setuptools<82) that a newer copy in front of it on PYTHONPATH would break; the image's torch brings its own.
GPU_SUITE_REQUIREMENTS = ["pytest>=8", "pytest-timeout>=2.3", "numpy"]
GPU_PAIR = ("torch===2.11.0", "torchvision==0.26.0")
GPU_RECIPE = REFERENCE_DIR / "recipes" / "upstream-2.11.0-cu130-py312.toml"


@nox.session(name="gpu-wheels")
def gpu_wheels(session: nox.Session) -> None:
    """gpu-wheels/: the wheels scripts/gpu-run.sh installs on the GPU machine (CPython 3.12, x86_64 manylinux):
    torchkiln's dependencies (pyproject.toml) and the suite's (pytest, pytest-timeout, NumPy),
    with theirs, and requirements.txt naming them. Fails over 64 MiB or with torch or an NVIDIA wheel in it."""
    import tomllib  # noqa: PLC0415

    session.install(PIP)
    shutil.rmtree(GPU_WHEELS, ignore_errors=True)
    GPU_WHEELS.mkdir()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"], *GPU_SUITE_REQUIREMENTS]
    (GPU_WHEELS / "requirements.txt").write_text("".join(f"{r}\n" for r in requirements))
    platforms = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64"]
    session.run(
        "python", "-m", "pip", "download", "--quiet", "--dest", str(GPU_WHEELS), "--only-binary=:all:",
        "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none",
        *(f"--platform={p}" for p in platforms), "-r", str(GPU_WHEELS / "requirements.txt"),
    )  # fmt: skip
    wheels = sorted(GPU_WHEELS.glob("*.whl"))
    total = sum(w.stat().st_size for w in wheels)
    heavy = [w.name for w in wheels if w.name.startswith(("torch-", "torchvision-", "nvidia_", "triton-"))]
    if heavy:
        session.error(f"gpu-wheels/ must not carry torch or its libraries (the image has them): {heavy}")
    if total > GPU_WHEELS_LIMIT:
        session.error(f"gpu-wheels/ holds {total / 2**20:.1f} MiB, over the 64 MiB the device tool carries")
    session.log(f"gpu-wheels/: {len(wheels)} wheels, {total / 2**20:.1f} MiB")


@nox.session(name="gpu-rehearsal", python="3.12")
def gpu_rehearsal(session: nox.Session) -> None:
    """scripts/gpu-run.sh rehearsed on this GPU-less machine: a venv standing in for the GPU image (upstream's
    torch 2.11.0+cu130 and torchvision 0.26.0 from PyPI, Python 3.12), gpu-wheels/ installed with pip
    --no-index as on the offline machine, then the run itself. It must fail exactly its CUDA checks, each as
    required-but-unable (no GPU here), and its described recipe must be the committed one. The stand-in is
    deleted afterwards (about 5.5 GB). TORCHKILN_WRITE_RECIPES=1 writes the recipe first (how it is made)."""
    import json  # noqa: PLC0415

    gpu_wheels(session)
    session.run("python", "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(Path(session.create_tmp()) / "pair"), *GPU_PAIR)  # fmt: skip
    session.install(*sorted(str(w) for w in (Path(session.create_tmp()) / "pair").glob("*.whl")))
    python = str(Path(session.bin) / "python")
    env = {"PYTHONPATH": str(ROOT / "src") + os.pathsep + str(_gpu_site(session, python))}
    if os.environ.get("TORCHKILN_WRITE_RECIPES") == "1":
        session.run(python, "-m", "torchkiln", "recipe", "describe", "--name", GPU_RECIPE.stem, "--out", str(GPU_RECIPE), env=env, external=True)  # fmt: skip
    out = ROOT / "gpu-run-out"  # gitignored; kept after the stand-in is deleted
    shutil.rmtree(out, ignore_errors=True)
    session.run("bash", str(ROOT / "scripts" / "gpu-run.sh"), env={"PYTHON": python, "OUT": str(out)},
                external=True, success_codes=[1])  # fmt: skip
    if not (out / "report" / "summary.json").is_file():
        session.error(f"the run wrote no report:\n{(out / 'run.log').read_text()[-3000:]}")
    summary = json.loads((out / "report" / "summary.json").read_text())
    wrong = [f for f in summary["failures"] if not f["message"].startswith("CUDA is required (")]
    if wrong:
        session.error(
            f"failures that are not CUDA-required-but-unable: {[(f['nodeid'], f['message'][:200]) for f in wrong]}"
        )
    areas = sorted({f["area"] for f in summary["failures"]})
    drift = (out / "recipe-drift.txt").read_text()
    if drift:
        session.error(f"the stand-in's pair is not the committed recipe's:\n{drift}")
    session.log(
        f"rehearsal: {summary['totals']}, every failure CUDA-required (areas {', '.join(areas)}), "
        f"{summary['duration_s']} s; report in {out}"
    )
    shutil.rmtree(Path(session.virtualenv.location), ignore_errors=True)


def _gpu_site(session: nox.Session, python: str) -> Path:
    """torchkiln's dependencies for describe before the run (the run installs its own from gpu-wheels/)."""
    site = Path(session.create_tmp()) / "describe-site"
    if not site.exists():
        session.run(python, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(GPU_WHEELS),
                    "--target", str(site), "-r", str(GPU_WHEELS / "requirements.txt"), external=True)  # fmt: skip
    return site


@nox.session
@nox.parametrize("suite", ["bookworm", "trixie"])
def readme(session: nox.Session, suite: str) -> None:
    """README.md word for word in a minimal root of Debian 12 or 13, as root, through ``nox -s unit``
    (tests/newcomer's ``readme`` form; the first build is the full form's): the front door on the machines
    the README names, in a chroot, where bubblewrap cannot make namespaces (as in an unprivileged container).
    Needs root, debootstrap, unshare and chroot, PyPI and Debian's archive."""
    _newcomer(session, suite, "readme")


@nox.session
@nox.parametrize("suite", ["bookworm", "trixie", "forky"])
def newcomer(session: nox.Session, suite: str) -> None:
    """README.md's whole way through on a fresh minimal Debian (tests/newcomer's ``full`` form): debootstrap
    of the suite (bookworm: Debian 12, python3 3.11; trixie: Debian 13, 3.13; forky: Debian 14, 3.14), then
    only the README's marked commands in a chroot, as root and as a user with sudo: set-up, the clone, the
    recipe for the system's python3, ``torchkiln check`` before and after the build packages, the first build
    from a local tree and ``nox -s unit``; the README's quoted outputs compared with what each printed. Not a
    default session (CI runs the readme form). ``nox -s "newcomer(suite='forky')"`` runs one suite.
    Transcripts in .torchkiln/newcomer/<suite>-<mode>.md."""
    _newcomer(session, suite, "full")


def _newcomer(session: nox.Session, suite: str, form: str) -> None:
    session.install(PIP)
    session.install("-e", ".[test]")
    # Its own temporary directory: each pytest session under /tmp/pytest-of-USER removes all but the newest
    # three there, so on a machine where others run pytest meanwhile, a 40-minute root vanished under apt.
    basetemp = ROOT / ".torchkiln" / f"newcomer-tmp-{form}-{suite}"
    basetemp.parent.mkdir(parents=True, exist_ok=True)  # pytest makes the directory, not its parents
    session.run(
        "python", "-m", "pytest", str(NEWCOMER_DIR), DURATIONS, "-p", "no:cacheprovider",
        f"--basetemp={basetemp}", *session.posargs,
        env={"TORCHKILN_NEWCOMER_SUITE": suite, "TORCHKILN_NEWCOMER_FORM": form},
    )  # fmt: skip


@nox.session(python="3.11")
def aarch64(session: nox.Session) -> None:
    """aarch64 (SBSA) under emulation (nightly; not a default session, see ARM64_IMAGES):
    tests/aarch64, an arm64 Debian root run by qemu-user with upstream's aarch64 torch 2.13.0 / torchvision
    0.28.0, `torchkiln verify` there against the recipe that describes them, one DDP launch, one-field
    controls failing by name, the x86_64 recipe refused there by build.platform; the shipped aarch64 recipe
    against upstream's aarch64 wheel file; and tests/test_images_arm64.py with TORCHKILN_ARM64_FULL=1: the
    linux/arm64 devel image (nvcc for every arch of the recipe, CMake, MAGMA, the test extension) and runtime
    image (verify in every area but ddp). Needs root, qemu-user-static, binfmt-support, debootstrap, buildah;
    the root is made once and cached."""
    session.install(PIP)
    session.install("-e", ".[test]")
    session.run(
        "python", "-m", "pytest", str(AARCH64_DIR), str(ARM64_IMAGES), DURATIONS,
        "-p", "no:cacheprovider", *session.posargs, env={"TORCHKILN_ARM64_FULL": "1"},
    )  # fmt: skip


@nox.session(name="build-wheel")
def build_wheel(session: nox.Session) -> None:
    """Build torch then torchvision wheels for a recipe: ``nox -s build-wheel -- --recipe recipes/x.toml``."""
    session.install(PIP)
    session.install("-e", ".")
    session.run("torchkiln", "build", *session.posargs)


@nox.session
def images(session: nox.Session) -> None:
    """Build the devel/runtime images of a recipe: ``nox -s images -- --recipe recipes/x.toml``."""
    session.install(PIP)
    session.install("-e", ".")
    session.run("torchkiln", "images", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks (compiler cache, no-op rebuild, verify suite time); results under bench/results/."""
    session.install(PIP)
    session.install("-e", ".[test]", TORCH_REQUIREMENT)
    session.run("python", "bench/run.py", *session.posargs)
