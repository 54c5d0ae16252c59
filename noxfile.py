"""nox sessions: thin wrappers around the torchkiln library and CLI.

``nox`` alone runs the default sessions (lint, tests, verify, reference): the command README.md and .ci/run
give.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests", "verify", "reference"]
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
# README.md's whole path in a fresh debootstrap root: `nox -s newcomer` only (not a default session).
NEWCOMER_DIR = ROOT / "tests" / "newcomer"
# The aarch64 proof in an arm64 root under qemu-user, and the arm64 images in full: `nox -s aarch64` only (not
# a default session; the tests session builds the arm64 images and checks them in part).
AARCH64_DIR = ROOT / "tests" / "aarch64"
# Every session's first install: a venv's own pip is whatever the Python's ensurepip bundles (Debian 12's venv
# pip is 23.0.1), and the tests need pip >= 23.1: it records the sha256 of a local wheel it installs in
# direct_url.json (verify's wheel_sha256 check reads it; tests/test_manifest.py) and takes --python-version
# without --target (--torch's dry run). 24 is what the reference tier already asked for.
PIP = "pip>=24"
# 2.12.1 and 2.13.0 are setup.py builds, 2.14.x scikit-build-core builds (data/compat.toml's frontend); 2.12's
# torch.cuda.get_arch_list() is [] without a GPU (2.13+ gate on _is_compiled()).
REFERENCE_PAIRS = {
    "2.12.1": ("torch===2.12.1", "torchvision==0.27.1", "upstream-2.12.1-cu130-py311.toml"),
    "2.13.0": ("torch===2.13.0", "torchvision==0.28.0", "upstream-2.13.0-cu130-py311.toml"),
    "2.14.0": ("torch===2.14.0", "torchvision==0.29.0", "upstream-2.14.0-cu130-py311.toml"),
    "2.14.1": ("torch===2.14.1", "torchvision==0.29.1", "upstream-2.14.1-cu130-py311.toml"),
}
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
    """torchkiln's own tests: the unit part, then the integration part (git, compilers, Redis, buildah where
    present), each with its slowest tests listed. Arguments after ``--`` replace both (one pytest run)."""
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
        DURATIONS,
    ]
    session.run(*base, "-m", f"not ({INTEGRATION})")
    session.run(*base, "-m", f"({INTEGRATION})")


@nox.session
def unit(session: nox.Session) -> None:
    """The unit part of the tests alone (under 2 minutes): ``nox -s unit``."""
    session.install(PIP)
    session.install("-e", ".[test]", TORCH_REQUIREMENT)
    session.run(
        "python", "-m", "pytest", "tests", "--ignore", str(REFERENCE_DIR), "--ignore", str(NEWCOMER_DIR),
        "--ignore", str(AARCH64_DIR), DURATIONS, "-m", f"not ({INTEGRATION})",
        *session.posargs,
    )  # fmt: skip


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
    """Ground truth: upstream's PyPI torch + torchvision (CUDA 13.0) in a fresh venv, verified against the
    recipe that describes them (every GPU-less check passes), then the negative controls (one recipe field
    changed each: the run must fail naming it). See tests/reference/."""
    torch_req, vision_req, recipe_name = REFERENCE_PAIRS[pair]
    recipe = REFERENCE_DIR / "recipes" / recipe_name
    tmp = Path(session.create_tmp())
    # Upstream's wheel files, installed from here and described by a manifest, so verify's provenance checks
    # (--manifest: versions, commits, sha256, installed files) run on them too.
    wheels = tmp / f"wheels-{pair}"
    session.install(PIP)
    session.run(
        "python",
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--dest",
        str(wheels),
        torch_req,
        vision_req,
    )
    session.install("-e", ".[test]", *sorted(str(w) for w in wheels.glob("*.whl")))
    # Each pair's venv holds 5.5 to 6.3 GB of torch and NVIDIA wheels, the pairs many of the same files: one
    # copy of those in .nox (the environment store's way, torchkiln.files.shared), CI's disk being finite.
    from torchkiln.files.shared import share_identical, sweep  # noqa: PLC0415 - stdlib only

    objects = ROOT / ".nox" / ".objects"
    sweep(objects)
    shared = share_identical(Path(session.virtualenv.location), objects)
    session.log(f"{shared.files} files ({shared.bytes / 2**30:.1f} GiB) linked to copies other sessions have")
    # ... and signed: SBOMs and a provenance statement over them (a key made for this run), so verify's
    # --provenance checks (signature, subjects, byproducts) run on them too.
    keys = tmp / f"keys-{pair}"
    session.run(
        "python", str(REFERENCE_DIR / "upstream_manifest.py"), str(recipe), str(wheels), "--sign", str(keys)
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


@nox.session
@nox.parametrize("suite", ["bookworm", "trixie"])
def newcomer(session: nox.Session, suite: str) -> None:
    """README.md's way through on a fresh minimal Debian, as a newcomer (tests/newcomer): debootstrap of the
    suite (bookworm: Debian 12, python3 3.11; trixie: Debian 13, python3 3.13), then only the README's marked
    commands in a chroot, as root and as a user with sudo: set-up, the clone, the recipe for the system's
    python3, `torchkiln check`, the first build from a local tree, `nox -s unit`; the README's quoted outputs
    compared with what each printed. Needs root, debootstrap, unshare and chroot, PyPI and Debian's archive;
    heavy (apt, a 4.7 GB torch, a compile, the unit tests, twice per suite), so not a default session.
    `nox -s newcomer` runs both suites, `nox -s "newcomer(suite='trixie')"` one. Transcripts in
    .torchkiln/newcomer/<suite>-<mode>.md."""
    session.install(PIP)
    session.install("-e", ".[test]")
    # Its own temporary directory: each pytest session under /tmp/pytest-of-USER removes all but the newest
    # three there, so on a machine where others run pytest meanwhile, a 40-minute root vanished under apt.
    basetemp = ROOT / ".torchkiln" / f"newcomer-tmp-{suite}"
    basetemp.parent.mkdir(parents=True, exist_ok=True)  # pytest makes the directory, not its parents
    session.run(
        "python", "-m", "pytest", str(NEWCOMER_DIR), DURATIONS, "-p", "no:cacheprovider",
        f"--basetemp={basetemp}", *session.posargs, env={"TORCHKILN_NEWCOMER_SUITE": suite},
    )  # fmt: skip


@nox.session(python="3.11")
def aarch64(session: nox.Session) -> None:
    """aarch64 (SBSA) under emulation, in full (nightly; CI's tests session runs the arm64 images in part):
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
        "python", "-m", "pytest", str(AARCH64_DIR), str(ROOT / "tests" / "test_images_arm64.py"), DURATIONS,
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
