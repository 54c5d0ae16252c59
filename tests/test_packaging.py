"""torchkiln as a wheel (issue 44, item 6): `pip install torchkiln` from the checkout, then `torchkiln verify`,
works with no checkout, as on a GPU node: the verification suite (the top-level verify/ directory) ships
inside the wheel as torchkiln/verify_suite."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest
from kit import ROOT
from kit.imagekit import need_torch

from torchkiln.shipped import tomllib

SUITE = ROOT / "verify"


def setuptools_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def suite_files() -> list[str]:
    return sorted(
        str(p.relative_to(SUITE)) for p in SUITE.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )


def test_the_listed_packages_are_every_package_of_src_and_the_suite() -> None:
    """pyproject.toml lists its packages (one lives outside src/): the list is every package under src/ and
    the suite's, so a new subpackage cannot be left out of the wheel."""
    found = {".".join(p.parent.relative_to(ROOT / "src").parts) for p in (ROOT / "src").rglob("__init__.py")}
    suite = {
        "torchkiln.verify_suite",
        *(
            f"torchkiln.verify_suite.{d.name}"
            for d in SUITE.iterdir()
            if d.is_dir() and d.name != "__pycache__"
        ),
    }
    config = setuptools_config()
    assert set(config["packages"]) == found | suite
    assert config["package-dir"]["torchkiln.verify_suite"] == "verify"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of the checkout's files (tracked and not ignored), built from a copy of them: setuptools
    packs what an in-tree build/ holds, a module since removed included."""
    out, copy = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("checkout")
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "-co", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", str(out), str(copy)],
        check=True, cwd=out,
    )  # fmt: skip
    (found,) = out.glob("torchkiln-*.whl")
    return found


@pytest.mark.integration
def test_the_wheel_carries_every_file_of_the_suite(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    shipped = sorted(
        n.removeprefix("torchkiln/verify_suite/") for n in names if n.startswith("torchkiln/verify_suite/")
    )
    assert shipped == suite_files()


@pytest.mark.integration
def test_an_installed_wheel_verifies_with_no_checkout(wheel: Path, tmp_path: Path) -> None:
    """A fresh venv with the wheel installed (not editable) and the torch this test runs (reached through a
    .pth line, after the venv's own packages), run from a directory that is no checkout: `torchkiln verify`
    finds the suite inside the wheel and runs it."""
    need_torch()
    target = tmp_path / "venv"
    venv.create(target, with_pip=True)
    python = target / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(wheel), "pytest", "pytest-timeout"], check=True
    )
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    Path(purelib, "the-tests-torch.pth").write_text(sysconfig.get_path("purelib") + "\n")
    where = tmp_path / "elsewhere"
    where.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHKILN_VERIFY_DIR", "PYTHONPATH")}
    done = subprocess.run(
        [str(python), "-m", "torchkiln", "verify", "--area", "release", "--", "-k", "matmul", "-p", "no:cacheprovider"],
        capture_output=True, text=True, cwd=where, env=env, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert f"{purelib}/torchkiln/verify_suite" in output  # the wheel's copy, not a checkout's
    assert " passed" in output


# Where the images build torchkiln from a copy of part of the checkout (the build context): each copy's list.
IMAGE_COPIES = {
    "docker/Dockerfile.devel": r"cp -r ((?:/mnt/context/\S+ )+)/opt/torchkiln/",
    "scripts/install_wheels.sh": r'cp -r ((?:"\$context/\S+" )+)"\$build/"',
}


def _copied(where: str) -> list[str]:
    match = re.search(IMAGE_COPIES[where], (ROOT / where).read_text())
    assert match, f"{where}: no copy of the checkout found (IMAGE_COPIES)"
    return [re.sub(r'^"?(/mnt/context|\$context)/|"$', "", part) for part in match.group(1).split()]


@pytest.mark.integration
@pytest.mark.parametrize("where", sorted(IMAGE_COPIES))
def test_the_images_copy_everything_the_wheel_is_built_from(where: str, wheel: Path, tmp_path: Path) -> None:
    """An image builds torchkiln from the paths it copies out of the build context (the devel image CI found
    without verify/, which the wheel now packages): a wheel built from only those paths is the checkout's."""
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in _copied(where):
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, copy / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(source, copy / name)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", str(out), str(copy)],
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, f"{where} copies {_copied(where)}: {done.stderr[-2000:]}"
    (built,) = out.glob("torchkiln-*.whl")
    with zipfile.ZipFile(built) as a, zipfile.ZipFile(wheel) as b:
        assert sorted(a.namelist()) == sorted(b.namelist())
