"""The 2.6 facts of data/compat.toml and the recipes that describe upstream's 2.6.0 CUDA 12.4 build, checked
against upstream's own wheel files (PyPI's torch 2.6.0 and torchvision 0.21.0 for cp311, fetched once and
cached by tests/kit/realtrees.pypi_wheel): version.py, METADATA's pins, the WHEEL generator and the -gencode list
compiled into libtorch_cuda.so. Nothing is installed: the wheels are read as zip files.

The recipe is `torchkiln recipe describe`'s output for that pair (`nox -s releases` installs and verifies it; it
is not one of CI's `nox -s reference` pairs), so these checks stand in for that run's recipe half in CI.
"""

from __future__ import annotations

import re
import zipfile
from email.parser import Parser
from functools import cache
from pathlib import Path

import pytest
from kit import ROOT, realtrees
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from torchkiln.recipe.compat import compat, minor
from torchkiln.recipe.loader import load_recipe
from torchkiln.recipe.model import Recipe

pytestmark = pytest.mark.integration

REFERENCE = ROOT / "tests" / "reference" / "recipes" / "upstream-2.6.0-cu124-py311.toml"
SHIPPED = ROOT / "recipes" / "torch-2.6-cu124-py310.toml"
# How nvcc's arguments are kept in the binary: "-gencode;arch=compute_50,code=sm_50;-gencode;..."
GENCODE = re.compile(rb"-gencode;arch=compute_(\d+)a?,code=(sm|compute)_(\d+)a?")


@cache
def torch_wheel() -> Path:
    return realtrees.pypi_wheel("torch==2.6.0", python_version="3.11")


@cache
def vision_wheel() -> Path:
    return realtrees.pypi_wheel("torchvision==0.21.0", python_version="3.11")


def _text(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        return z.read(name).decode()


def _dist_info(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        [member] = [m for m in z.namelist() if m.endswith(f".dist-info/{name}")]
        return z.read(member).decode()


def _version_py(wheel: Path, package: str) -> dict[str, str]:
    """The assignments of ``<package>/version.py`` (``__version__``, ``cuda``, ``git_version``)."""
    text = _text(wheel, f"{package}/version.py")
    return dict(re.findall(r"^(\w+)(?:: [^=]+)? = '([^']*)'", text, re.MULTILINE))


def _pins(wheel: Path) -> dict[str, str]:
    """METADATA's ``name==version`` requirements (the markers dropped)."""
    metadata = Parser().parsestr(_dist_info(wheel, "METADATA"))
    out = {}
    for line in metadata.get_all("Requires-Dist") or []:
        specs = list(Requirement(line).specifier)
        if len(specs) == 1 and specs[0].operator == "==":
            out[Requirement(line).name] = specs[0].version
    return out


def _gencode_arch_list(wheel: Path) -> list[str]:
    """The arch list nvcc compiled libtorch_cuda.so for, as a recipe writes it ("8.6", "12.0+PTX"): read
    from the wheel's member as a stream (it is 900 MB), the first -gencode list found."""
    tail = b""
    with zipfile.ZipFile(wheel) as z, z.open("torch/lib/libtorch_cuda.so") as so:
        while block := so.read(1 << 24):
            data = tail + block
            start = data.find(b"-gencode;arch=")
            if start >= 0 and data.find(b"\0", start) > 0:
                entries = GENCODE.findall(data[start : data.index(b"\0", start)])
                cubins = [f"{int(c) // 10}.{int(c) % 10}" for _, kind, c in entries if kind == b"sm"]
                ptx = {f"{int(c) // 10}.{int(c) % 10}" for _, kind, c in entries if kind == b"compute"}
                return [a + "+PTX" if a in ptx else a for a in cubins]
            tail = data[-4096:]
    raise AssertionError(f"{wheel.name}: no -gencode list in torch/lib/libtorch_cuda.so")


@pytest.fixture(scope="module")
def reference() -> Recipe:
    return load_recipe(REFERENCE)


def test_torch_wheel_is_what_the_reference_recipe_says(reference: Recipe) -> None:
    wheel = torch_wheel()
    version = _version_py(wheel, "torch")
    assert version["__version__"] == reference.torch_wheel_version == "2.6.0+cu124"
    assert version["cuda"] == str(reference.accelerator.cuda)
    assert version["git_version"] == reference.torch.commit
    pins = _pins(wheel)
    assert pins["nvidia-cudnn-cu12"] == str(reference.accelerator.cudnn)
    assert pins["nvidia-nccl-cu12"] == str(reference.accelerator.nccl)
    assert _gencode_arch_list(wheel) == list(reference.accelerator.arch_list)


def test_compat_data_of_2_6_is_the_wheels() -> None:
    """data/compat.toml's torch 2.6 and CUDA 12.4 entries against the wheels: the Python floor is METADATA's
    Requires-Python, the frontend is setuptools (bdist_wheel wrote WHEEL), the torchvision pair is the one
    whose METADATA pins torch 2.6.0, and 12.4's default arch list is the wheel's."""
    wheel, release = torch_wheel(), compat()["torch"]["2.6"]
    metadata = Parser().parsestr(_dist_info(wheel, "METADATA"))
    floor = SpecifierSet(metadata["Requires-Python"])
    assert [s.version for s in floor] == ["3.9.0"]
    assert "3.9" in SpecifierSet(release["python"]) and "3.8" not in SpecifierSet(release["python"])
    generator = Parser().parsestr(_dist_info(wheel, "WHEEL"))["Generator"]
    assert generator.startswith("bdist_wheel") and release["frontend"] == "setup.py"
    assert _pins(vision_wheel())["torch"] == "2.6.0"
    assert minor(Version(_version_py(vision_wheel(), "torchvision")["__version__"])) == release["torchvision"]
    assert compat()["cuda"]["12.4"]["default_arch"] == _gencode_arch_list(wheel)


def test_vision_wheel_is_what_the_reference_recipe_says(reference: Recipe) -> None:
    wheel = vision_wheel()
    version = _version_py(wheel, "torchvision")
    assert version["__version__"] == reference.torchvision_wheel_version == "0.21.0+cu124"
    assert version["git_version"] == reference.torchvision.commit
    with zipfile.ZipFile(wheel) as z:
        bundled = {m.split("/")[1].split(".")[0] for m in z.namelist() if m.startswith("torchvision.libs/")}
    codecs = {"png": "libpng16", "jpeg": "libjpeg", "webp": "libwebp", "nvjpeg": "libnvjpeg"}
    for feature, library in codecs.items():
        assert getattr(reference.vision, feature) == (library in bundled), feature


def test_shipped_2_6_recipe_pins_what_upstream_built(reference: Recipe) -> None:
    shipped = load_recipe(SHIPPED)
    for field in ("cuda", "arch_list", "cudnn", "nccl"):
        assert getattr(shipped.accelerator, field) == getattr(reference.accelerator, field), field
    assert shipped.torch.version == reference.torch.version
    assert shipped.torchvision.version == reference.torchvision.version
