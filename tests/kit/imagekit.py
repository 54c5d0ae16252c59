"""What the real image builds share (tests/test_images_build.py, tests/test_images_cuda.py): the report file,
the CLI call, image sizes, the rule that CI never skips them. Their fixtures are in tests/conftest.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from types import ModuleType

import pytest

from kit import ROOT
from torchkiln import cli
from torchkiln.images.engines import Buildah, Engine, Storage
from torchkiln.images.platforms import image_platform, platform_named
from torchkiln.images.rootfs import plan_debootstrap
from torchkiln.plan.make import make_plan
from torchkiln.process import runner
from torchkiln.recipe.image_bases import DISTROS
from torchkiln.recipe.model import Recipe

# The host's CA bundle goes into the base as local CAs, so TLS through this machine's egress proxy works in
# RUN steps (as a corporate CA would): `torchkiln images --base-ca`.
HOST_CAS = tuple(str(p) for p in (Path("/etc/ssl/certs/ca-certificates.crt"),) if p.is_file())
# The base every real image build here uses: Debian bookworm made by debootstrap (no registry is reachable),
# exactly what `torchkiln images --base-from debootstrap --base-ca HOST_CA` makes and tags for the CPU recipe
# (tests/conftest.py makes it once per session through the same code; the CLI then finds it and reuses it).
BASE_SPEC = plan_debootstrap(
    "debian12", DISTROS["debian12"], archive=None, cas=HOST_CAS, target=platform_named("x86_64")
)
BASE = BASE_SPEC.tag
REPORT = ROOT / ".torchkiln" / "images-report.json"


def require(condition: bool, reason: str) -> None:
    """Skip without the condition; under CI=true it is a failure instead (CI installs what these need).
    Called at a module's top level, it skips (or fails) the whole module."""
    if condition:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


# Hypothesis: CI explores more (tests/conftest.py loads the "ci" profile under CI=true: derandomized, so a
# failure there is the same on a rerun). A test's own count is what a quick local run draws.
EXPLORE = int(os.environ.get("TORCHKILN_HYPOTHESIS_EXPLORE", "4" if os.environ.get("CI") == "true" else "1"))


def examples(count: int) -> int:
    """A test's max_examples: its own count, times TORCHKILN_HYPOTHESIS_EXPLORE (4 under CI=true)."""
    return count * EXPLORE


TORCH_MISSING = (
    "torch is not installed: `nox -s unit` takes only a torch this machine's pip offers without a download "
    "(find-links), `nox -s tests` installs TORCHKILN_TORCH (torch==2.13.0)"
)


def need_torch() -> ModuleType:
    """torch, for a test that runs it; skipped without it (failed under CI=true)."""
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        require(False, TORCH_MISSING)
    return torch


def unisolated_signing_allowed() -> bool:
    """For a test that signs a build but is about something else (a record's fields): where this host cannot
    sandbox the build's steps (a chroot, an unprivileged container, no bubblewrap), the build signs with
    --allow-unisolated, which its records then state; where it can, the test signs as a user would."""
    from torchkiln.process import isolation  # noqa: PLC0415

    return not isolation.probe().ok


def need_sandbox() -> str:
    """bwrap's path, for a test that runs something in a bubblewrap sandbox; skipped where bubblewrap is
    missing or cannot make namespaces here (a chroot, an unprivileged container: bubblewrap's own reason),
    failed under CI=true. Asks the product's own probe (torchkiln.process.isolation.probe)."""
    from torchkiln.process import isolation  # noqa: PLC0415

    found = isolation.probe()
    require(found.ok, found.reason or "bubblewrap cannot make a sandbox here")
    assert found.bwrap is not None
    return found.bwrap


def need(tool: str, path: str | None = None) -> str:
    """The tool's path (``shutil.which``, on ``path`` when given); skipped without it, failed under CI=true
    (CI installs what the tests need)."""
    found = shutil.which(tool, path=path)
    require(found is not None, f"{tool} is not installed (CI installs it)")
    assert found is not None
    return found


def report(key: str, value: object) -> None:
    """Record a measurement in .torchkiln/images-report.json (atomically; one writer at a time)."""
    from kit.cachelock import exclusive

    with exclusive(REPORT):
        data = json.loads(REPORT.read_text()) if REPORT.exists() else {}
        data[key] = value
        tmp = REPORT.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, REPORT)


def say(capsys: pytest.CaptureFixture[str], text: str) -> None:
    with capsys.disabled():
        print(f"\n[images] {text}")


def stored_size(engine: Engine, image: str) -> int:
    found = engine.image_size(image)
    assert found, image
    return found


def overlay_mounts(scratch: Path) -> bool:
    """Whether the kernel mounts an overlay in ``scratch`` (buildah's overlay driver needs one; vfs does not;
    an overlay upper directory on an overlay, as in some containers, is refused)."""
    dirs = {name: scratch / name for name in ("lower", "upper", "work", "merged")}
    for path in dirs.values():
        path.mkdir(parents=True)
    options = f"lowerdir={dirs['lower']},upperdir={dirs['upper']},workdir={dirs['work']}"
    done = subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", options, str(dirs["merged"])], capture_output=True
    )
    if done.returncode == 0:
        subprocess.run(["umount", str(dirs["merged"])], check=True)
    shutil.rmtree(scratch)
    return done.returncode == 0


def storage_driver(scratch: Path) -> str:
    """The image tests' buildah storage driver: overlay where the kernel mounts one in ``scratch`` (the
    storage's filesystem), else vfs; TORCHKILN_TEST_STORAGE_DRIVER=vfs|overlay chooses. vfs copies the whole
    root for every layer and every container (the CUDA runtime image's 5 GB venv once more for each run in
    it); overlay stores only what each layer changed."""
    chosen = os.environ.get("TORCHKILN_TEST_STORAGE_DRIVER", "")
    if chosen:
        assert chosen in ("vfs", "overlay"), f"TORCHKILN_TEST_STORAGE_DRIVER={chosen!r}: vfs or overlay"
        return chosen
    return "overlay" if overlay_mounts(scratch) else "vfs"


def private_buildah(root: Path) -> Buildah:
    """buildah on a private storage under ``root`` (``storage/``, ``run/``), on :func:`storage_driver`."""
    driver = storage_driver(root / "overlay-probe")
    return Buildah("buildah", Storage(root / "storage", root / "run", driver))


def remove_all(engine: Buildah) -> None:
    """Every container and image in ``engine``'s storage, removed (by its own driver: buildah refuses a
    storage opened with another)."""
    runner.run(engine.command("rm", "--all"))
    runner.run(engine.command("rmi", "--all", "--force"))


def cli_argv(engine: Buildah, recipe: Path, *args: str) -> list[str]:
    """``torchkiln images`` arguments: buildah on ``engine``'s private storage (its root's parent as
    ``--storage-root``, its driver) and the debootstrapped base (which the ``base_image`` fixture has made:
    the CLI reuses it)."""
    storage = engine.storage
    assert storage.root is not None and storage.driver is not None
    cas = [arg for ca in HOST_CAS for arg in ("--base-ca", ca)]
    return [
        "images",
        "--recipe",
        str(recipe),
        "--engine",
        "buildah",
        "--base-from",
        "debootstrap",
        *cas,
        "--storage-root",
        str(storage.root.parent),
        "--storage-driver",
        storage.driver,
        *args,
    ]


def cli_build(engine: Buildah, recipe: Path, *args: str) -> int:
    """``torchkiln images`` (:func:`cli_argv`) in this process."""
    return cli.main(cli_argv(engine, recipe, *args))


# What the build plan gives a recipe's torch build that tests/data/cuda_devel_checks.sh reads.
PLAN_ENV = ("CUDA_HOME", "CUDACXX", "NCCL_ROOT", "NCCL_INCLUDE_DIR", "NCCL_LIB_DIR", "TORCH_CUDA_ARCH_LIST")


def devel_checks(
    engine: Engine,
    image: str,
    recipe: Recipe,
    wheels: Path,
    *,
    timeout: float,
    qemu_cpu: str = "",
    extra_env: dict[str, str] | None = None,
) -> tuple[dict[str, list[dict]], float]:
    """tests/data/cuda_devel_checks.sh in one container of the devel ``image``, with the environment the build
    plan gives ``recipe``'s torch build and upstream's torch wheel from ``wheels`` (``qemu_cpu``: an image of
    another machine, emulated; ``extra_env`` last, e.g. KILN_CHECKS, the sections to run). Returns its
    ``KILN <section> <json>`` reports by section, and its seconds."""
    plan_env = make_plan(recipe, only="torch").env_for("torch")
    env = {name: plan_env[name] for name in PLAN_ENV}
    env |= {
        "KILN_CHECKOUT": "/mnt/checkout",
        "KILN_WHEELS": "/mnt/wheels",
        "KILN_CUDA": str(recipe.accelerator.cuda),
        "EXPECT_CUDNN": ".".join(str(recipe.accelerator.cudnn).split(".")[:3]),
        "EXPECT_NCCL": str(recipe.accelerator.nccl),
        "KILN_TOOLKIT_TARGET": image_platform(recipe).toolkit_target,
    }
    env |= extra_env or {}
    start = time.monotonic()
    done = engine.run(
        image,
        ["bash", "/mnt/checkout/tests/data/cuda_devel_checks.sh"],
        env=env,
        mounts={ROOT: "/mnt/checkout", wheels: "/mnt/wheels"},
        capture=True,
        timeout=timeout,
        qemu_cpu=qemu_cpu,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]
    sections: dict[str, list[dict]] = {}
    for line in done.stdout.splitlines():
        if match := re.match(r"^KILN (\w+) (\{.*\})$", line):
            sections.setdefault(match[1], []).append(json.loads(match[2]))
    return sections, time.monotonic() - start
