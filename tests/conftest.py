"""Session fixtures: one environment store per test session (every ``torchkiln build`` a test starts shares it,
as builders on one machine do, and none touches the user's ~/.cache); for the real image builds
(tests/test_images_build.py, tests/test_images_cuda.py) one private buildah storage root and one
debootstrapped Debian bookworm base per session, both removed at the end (the images each module builds
are removed when it ends: ``own_images``); upstream's real PyTorch 2.6.0 and
torchvision 0.21.0 release sources (tests/kit/realtrees.py), extracted once per session."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from kit import fixturetmp, realtrees
from kit.imagekit import BASE, BASE_SPEC, private_buildah, remove_all, report, require

from torchkiln.images import rootfs
from torchkiln.images.engines import Buildah
from torchkiln.process import runner

# Hypothesis under CI=true (issue 44): derandomized (a failure reproduces on a rerun, and on a newcomer's
# machine with the same code) and exploring more (imagekit.examples: each test's count times 4). A case found
# so is then kept as an explicit @example of its test.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI") == "true":
    settings.load_profile("ci")


# The tests run in two processes (pytest-xdist: `nox -s tests`), each taking the next group of tests when it is
# free (ByGroup). A group is a module, whose module fixtures are so made once, except that the modules using
# the session's buildah storage and debootstrapped base (IMAGE_FIXTURES) are one group, IMAGE_MODULES, so those
# are made once too (collection fails on a module that uses them outside the table). The groups that take
# longest start first (LONGEST_FIRST, from CI's durations), the unit modules last, so what is left at the end
# is short and neither process waits long on the other. Without xdist the order is the only change.
IMAGE_FIXTURES = frozenset({"storage_root", "engine", "debootstrap_root", "base_image", "own_images"})
IMAGE_MODULES = frozenset(
    {"test_container.py", "test_images_arm64.py", "test_images_build.py", "test_images_cuda.py"}
)
LONGEST_FIRST = (
    "images",
    "test_vision_build.py",
    "test_build.py",
    "test_cluster.py",
    "test_signals.py",
    "test_bench.py",
    "test_deploy.py",
)


def group_of(module: str) -> str:
    """The group of a test module (its file name): "images", or the module itself."""
    return "images" if module in IMAGE_MODULES else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's scheduler by whole groups (its own by-group mode marks node ids, which pytest 9.2 no longer lets a
    plugin change)."""
    from xdist.scheduler import LoadScopeScheduling  # noqa: PLC0415 - only under xdist

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid.split("::", 1)[0].rsplit("/", 1)[-1])

    return ByGroup(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    outside = sorted(
        {item.nodeid for item in items if IMAGE_FIXTURES & set(getattr(item, "fixturenames", ()))}
        - {item.nodeid for item in items if item.path.name in IMAGE_MODULES}
    )
    if outside:
        raise pytest.UsageError(f"tests/conftest.py: IMAGE_MODULES lacks the modules of {outside[:3]}")
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    marked = [
        item for item in items if item.get_closest_marker("integration") or item.get_closest_marker("slow")
    ]
    integration = {group_of(item.path.name) for item in marked}

    def order(item: pytest.Item) -> int:  # the table's, then other integration groups, then unit modules
        group = group_of(item.path.name)
        return rank.get(group, len(rank) + (group not in integration))

    items.sort(key=order)  # stable: a module keeps its order


PLUGIN = "torchkiln-fixturetmp"


def pytest_configure(config: pytest.Config) -> None:
    """What a fixture makes with tmp_path_factory is removed at its teardown (kit/fixturetmp.py), not at the
    session's end: module fixtures' build trees and venvs held gigabytes through the rest of the run.
    Registered as a plugin, so that its hooks see the session's fixtures too."""
    if not config.pluginmanager.has_plugin(PLUGIN):
        config.pluginmanager.register(fixturetmp, PLUGIN)


@pytest.fixture(scope="session", autouse=True)
def env_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    store = tmp_path_factory.mktemp("env-store")
    before = os.environ.get("TORCHKILN_ENV_STORE")
    os.environ["TORCHKILN_ENV_STORE"] = str(store)
    yield store
    if before is None:
        del os.environ["TORCHKILN_ENV_STORE"]
    else:
        os.environ["TORCHKILN_ENV_STORE"] = before


@pytest.fixture(scope="session")
def storage_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    require(os.geteuid() == 0, "image builds need root")
    for tool in ("buildah", "debootstrap"):
        require(
            shutil.which(tool) is not None, f"{tool} is not installed (apt-get install buildah debootstrap)"
        )
    root = tmp_path_factory.mktemp("buildah")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def engine(storage_root: Path) -> Iterator[Buildah]:
    """buildah on the session's storage, overlay where the kernel mounts one there (imagekit.storage_driver);
    its containers and images are removed when the session ends."""
    engine = private_buildah(storage_root)
    report("storage_driver", engine.storage.driver)
    yield engine
    remove_all(engine)


@pytest.fixture(scope="session")
def debootstrap_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Debian bookworm (minbase), made once per session by the step `torchkiln images --base-from
    debootstrap` runs (torchkiln.images.rootfs.make_root). Shared by the session: the image tests import it
    as their base, tests/newcomer copies it (copy it before changing anything in it)."""
    require(os.geteuid() == 0, "debootstrap needs root")
    require(
        shutil.which("debootstrap") is not None, "debootstrap is not installed (apt-get install debootstrap)"
    )
    assert BASE_SPEC.debootstrap is not None
    root = tmp_path_factory.mktemp("debootstrap") / "rootfs"
    start = time.monotonic()
    try:
        rootfs.make_root(BASE_SPEC.debootstrap, root)
    finally:
        rootfs.unmount_leftovers(root)
    report("debootstrap_seconds", round(time.monotonic() - start, 1))
    return root


@pytest.fixture(scope="session")
def base_image(engine: Buildah, debootstrap_root: Path) -> str:
    """The debootstrapped root imported as an image, as `torchkiln images --base-from debootstrap --base-ca
    HOST_CA` imports it (torchkiln.images.rootfs.import_root, the same tag), so the CLI reuses it."""
    start = time.monotonic()
    rootfs.import_root(engine, debootstrap_root, BASE, BASE_SPEC.cas)
    assert engine.image_exists(BASE)
    report("base_seconds", round(time.monotonic() - start, 1))
    return BASE


@pytest.fixture(scope="module")
def own_images(engine: Buildah, base_image: str) -> Iterator[None]:
    """The images and containers a test module made are removed when it ends, the base kept for the next
    module. Left for the session (on vfs, which keeps a whole copy of the root for every layer and container),
    the CPU and CUDA devel and runtime images held gigabytes through every later test (CI ran out of disk in the
    torchvision build that came after them)."""
    yield
    runner.run(engine.command("rm", "--all"))
    listed = runner.run(engine.command("images", "--all", "--noheading", "--no-trunc", "--format", "{{.ID}}"))
    keep = runner.run(
        engine.command("images", "--noheading", "--no-trunc", "--format", "{{.ID}}", base_image)
    )
    kept = set(keep.stdout.split())
    assert kept, f"the base image {base_image} is gone from the session's storage"
    for image in dict.fromkeys(listed.stdout.split()):
        if image not in kept:
            engine.remove_image(image)


@pytest.fixture(scope="session")
def pytorch_2_6_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Upstream's PyTorch 2.6.0 release source (Debian's orig tarball: no submodules). Shared by the session:
    copy it (shutil.copytree) before changing anything in it."""
    return realtrees.extract(realtrees.PYTORCH_2_6_0, tmp_path_factory.mktemp("pytorch-2.6.0"))


@pytest.fixture(scope="session")
def vision_0_21_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Upstream's torchvision 0.21.0 release source. Shared by the session: copy it before changing it."""
    return realtrees.extract(realtrees.VISION_0_21_0, tmp_path_factory.mktemp("vision-0.21.0"))


# Real small filesystems (issue 14 item 8, issue 27 item 5): a full disk is a full tmpfs, not a mock.


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[object]:
    """``mount(name, options)``: a real tmpfs at tmp_path/name (root only), unmounted afterwards."""
    mounted: list[Path] = []

    def make(name: str, options: str) -> Path:
        require(os.geteuid() == 0, "a real full or read-only filesystem needs root to mount a tmpfs")
        point = tmp_path / name
        point.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True, text=True
        )
        require(done.returncode == 0, f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(point)
        return point

    yield make
    for point in reversed(mounted):
        subprocess.run(["umount", "-l", str(point)], check=False)


@pytest.fixture
def repo(tmp_path: Path) -> dict[str, str]:
    """A local repository standing in for PyTorch's (its VERSION file at tag v1): ``url`` (file://), ``v1``
    (the commit). Real git, what the fetch steps fetch from."""
    from test_build_fetch import git

    path = tmp_path / "up" / "pytorch"
    path.mkdir(parents=True)
    git(path, "init", "-q")
    (path / "VERSION").write_text("v1")
    git(path, "add", "VERSION")
    git(path, "commit", "-qm", "v1")
    git(path, "tag", "v1")
    return {"url": f"file://{path}", "v1": git(path, "rev-parse", "HEAD")}
