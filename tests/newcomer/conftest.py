"""The debootstrap roots of the suites tests/newcomer follows the README on: Debian 12 (bookworm, python3 3.11)
is the session's own root (tests/conftest.py, shared with the image tests); Debian 13 (trixie, python3 3.13)
is made here the same way, once per session. Each test copies its root before changing anything."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from imagekit import HOST_CAS, report, require

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


@pytest.fixture
def suite_root(request: pytest.FixtureRequest, suite: str) -> Path:
    """The minimal root of ``suite`` (a parameter of the test)."""
    return request.getfixturevalue("debootstrap_root" if suite == "bookworm" else "trixie_root")
