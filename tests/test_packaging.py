"""torchkiln as a wheel (issue 44, item 6): `pip install torchkiln` from the checkout, then `torchkiln verify`,
works with no checkout, as on a GPU node: the verification suite (the top-level verify/ directory) ships
inside the wheel as torchkiln/verify_suite."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest
from imagekit import need_torch

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (Ubuntu 22.04's python3)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
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
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", str(out), str(ROOT)],
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
