"""data/compat.toml [cuda_libraries] against upstream's own wheels: the Requires-Dist of each release's PyPI wheel
(its METADATA, as the package index serves it: `pip install --dry-run --no-deps --report`, no download), the
cuda-toolkit pins against the per-component pins of upstream's CUDA 12 wheels, the RPATH upstream's 2.6.0 and
2.13.0 torch wheels carry (tests/kit/realtrees.pypi_wheel, cached: other tests fetch both), and torchvision's
wheels bundling their nvJPEG and cudart (so torchkiln's torchvision:bundle step stays)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from kit import realtrees
from packaging.requirements import Requirement

from torchkiln.artifacts import cudalibs
from torchkiln.recipe.compat import compat

pytestmark = pytest.mark.integration

DATA = compat()["cuda_libraries"]


def index_report(*requirements: str, deps: bool = False, python: str = "3.12") -> list[dict[str, object]]:
    """What pip would install for ``requirements`` (their metadata, from the index; nothing is downloaded)."""
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed"]
    argv += ["--only-binary=:all:", "--python-version", python, "--report", "-"]
    done = subprocess.run(
        [*argv, *([] if deps else ["--no-deps"]), *requirements], capture_output=True, text=True, check=False
    )
    realtrees.require(done.returncode == 0, f"the package index did not answer: {done.stderr[-800:]}")
    installs: list[dict[str, object]] = json.loads(done.stdout)["install"]
    return installs


@pytest.mark.parametrize("release", sorted(DATA["release"]))
def test_each_release_row_is_its_pypi_wheels_requires_dist(release: str) -> None:
    row = DATA["release"][release]
    name, digest = row["wheel"].split(" sha256:")
    version = name.split("-")[1]
    [item] = index_report(f"torch==={version}")
    info = item["download_info"]
    assert isinstance(info, dict) and info["url"].endswith("/" + name), info
    assert info["archive_info"]["hashes"]["sha256"] == digest
    metadata = item["metadata"]
    assert isinstance(metadata, dict)
    declared = [str(Requirement(r)) for r in metadata["requires_dist"]]
    assert row["requires"] == [
        r for r in declared if Requirement(r).name.startswith(("nvidia-", "cuda-", "triton"))
    ]


@pytest.mark.parametrize("release", ["2.6", "2.7", "2.8"])
def test_the_cuda_toolkit_pin_brings_upstreams_component_pins(release: str) -> None:
    """cuda-toolkit 12.4.1 / 12.6.3 / 12.8.1 with the default extras resolves to the nvidia-*-cu12 component
    versions of upstream's 2.6.0 / 2.7.1 / 2.8.0 wheels: the fallback of a recipe whose CUDA is not its
    release's PyPI one declares what upstream's wheels of that CUDA declare. One known difference, of a patch
    build within the CUDA minor: 2.7.1 pinned NVRTC 12.6.77 (cuda-toolkit 12.6.2's), 12.6.3 has 12.6.85
    (upstream's own later CUDA 12.6 builds declare cuda-toolkit 12.6.3)."""
    row = DATA["release"][release]
    wanted = {
        r.name: str(r.specifier).removeprefix("==")
        for r in map(Requirement, row["requires"])
        if r.name.removesuffix("-cu12") in DATA["components"]
    }
    extras = ",".join(DATA["extras"])
    resolved = index_report(f"cuda-toolkit[{extras}]=={DATA['toolkit'][row['cuda']]}", deps=True)
    got = {item["metadata"]["name"]: item["metadata"]["version"] for item in resolved}  # type: ignore[index]
    mismatched = {n: (v, got.get(n)) for n, v in wanted.items() if got.get(n) != v}
    assert mismatched == ({"nvidia-cuda-nvrtc-cu12": ("12.6.77", "12.6.85")} if release == "2.7" else {})


def rpath_of(wheel: Path, member: str, tmp: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        (tmp / "object.so").write_bytes(archive.read(member))
    with (tmp / "object.so").open("rb") as stream:
        for section in ELFFile(stream).iter_sections():
            if isinstance(section, DynamicSection):
                for tag in section.iter_tags():
                    if tag.entry.d_tag in ("DT_RPATH", "DT_RUNPATH"):
                        return str(getattr(tag, "rpath", None) or tag.runpath).split(":")
    return []


@pytest.mark.parametrize(("requirement", "major"), [("torch===2.13.0", "13"), ("torch==2.6.0", "12")])
def test_the_planned_rpath_is_upstreams(requirement: str, major: str, tmp_path: Path) -> None:
    """torch/lib/libtorch_cuda.so of upstream's wheel: CUDA 13, the planned entries exactly; CUDA 12, every
    entry of upstream's within the planned ones (the plan's list adds nvshmem, cufile, nvidia/cusparselt that
    later releases link), then $ORIGIN."""
    wheel = realtrees.pypi_wheel(requirement, python_version="3.11")
    theirs = rpath_of(wheel, "torch/lib/libtorch_cuda.so", tmp_path)
    mine, _ = cudalibs.planned_rpath("torch/lib/libtorch_cuda.so", ["$ORIGIN"], DATA["lib_dirs"][major])
    assert theirs[-1] == mine[-1] == "$ORIGIN"
    if major == "13":
        assert theirs == mine
    else:
        assert set(theirs) <= set(mine) and len(theirs) >= 12, (theirs, mine)


@pytest.mark.parametrize("release", ["torchvision==0.21.0", "torchvision===0.28.0"])
def test_upstreams_torchvision_bundles_nvjpeg_and_cudart(release: str) -> None:
    """Upstream's CUDA torchvision wheels (0.21.0: CUDA 12.4, 0.28.0: CUDA 13.0; every release from 0.21.0 to
    0.29.0 read so) carry libnvjpeg and libcudart in torchvision.libs and declare no NVIDIA wheel: torchkiln's
    torchvision wheel bundles them the same way (torchkiln.artifacts.bundle), not through Requires-Dist."""
    wheel = realtrees.pypi_wheel(release, python_version="3.11")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    bundled = {n.split("/")[1].split(".")[0] for n in names if n.startswith("torchvision.libs/")}
    assert {"libnvjpeg", "libcudart"} <= bundled, bundled
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert not [line for line in requires if "nvidia" in line or "cuda" in line], requires
