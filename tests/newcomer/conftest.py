"""The debootstrap roots of the suites tests/newcomer follows the README on: Debian 12 (bookworm, python3 3.11)
is the session's own root (tests/conftest.py, shared with the image tests); Debian 13 (trixie, python3 3.13)
is made here the same way, and Debian 14 (forky, python3 3.14, not yet released: its testing suite) with
debootstrap's sid script where this debootstrap has none of its own (Debian 12's 1.0.128 has none), once per
session. Each test copies its root before changing anything."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from kit.imagekit import HOST_CAS, report, require

from torchkiln.images import rootfs
from torchkiln.images.platforms import platform_named
from torchkiln.recipe.image_bases import DISTROS

# suite -> the DISTROS row debootstrap makes it from
SUITES = {"bookworm": "debian12", "trixie": "debian13"}


@pytest.fixture(scope="session")
def trixie_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require(os.geteuid() == 0, "debootstrap needs root")
    require(
        shutil.which("debootstrap") is not None, "debootstrap is not installed (apt-get install debootstrap)"
    )
    spec = rootfs.plan_debootstrap(
        "debian13", DISTROS["debian13"], archive=None, cas=HOST_CAS, target=platform_named("x86_64")
    )
    assert spec.debootstrap is not None
    root = tmp_path_factory.mktemp("debootstrap-trixie") / "rootfs"
    start = time.monotonic()
    try:
        rootfs.make_root(spec.debootstrap, root)
    finally:
        rootfs.unmount_leftovers(root)
    report("debootstrap_trixie_seconds", round(time.monotonic() - start, 1))
    return root


@pytest.fixture(scope="session")
def forky_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require(os.geteuid() == 0, "debootstrap needs root")
    debootstrap = shutil.which("debootstrap")
    require(debootstrap is not None, "debootstrap is not installed (apt-get install debootstrap)")
    assert debootstrap is not None
    scripts = Path("/usr/share/debootstrap/scripts")
    script = [] if (scripts / "forky").exists() else [str(scripts / "sid")]
    root = tmp_path_factory.mktemp("debootstrap-forky") / "rootfs"
    argv = [debootstrap, "--variant=minbase", f"--keyring={DISTROS['debian13'].keyring}", "forky", str(root)]
    start = time.monotonic()
    try:
        subprocess.run([*argv, DISTROS["debian13"].archive_for("amd64"), *script], check=True)
    finally:
        rootfs.unmount_leftovers(root)
    report("debootstrap_forky_seconds", round(time.monotonic() - start, 1))
    return root


ROOTS = {"bookworm": "debootstrap_root", "trixie": "trixie_root", "forky": "forky_root"}


@pytest.fixture
def suite_root(request: pytest.FixtureRequest, suite: str) -> Path:
    """The minimal root of ``suite`` (a parameter of the test)."""
    return request.getfixturevalue(ROOTS[suite])
