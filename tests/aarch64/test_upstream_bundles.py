"""Upstream's aarch64 torch wheels carry exactly the runtime libraries data/compat.toml [runtime_libraries] lists
for their build (`nox -s aarch64`, not a default session: the wheels are 96 MB and 427 MB; the x86_64 ones are
read in tests/test_runtime_libraries.py).

- 2.13.0 (PyPI's aarch64 wheel is its CUDA 13.0 build, BLAS NVPL): torch/lib/libgomp.so.1, libgfortran.so.5,
  libarm_compute.so, libarm_compute_graph.so and NVPL's four libraries, under their own names (repair_wheel.py);
  every file of torch/lib, those included, with the DT_RPATH of its CUDA directories then $ORIGIN.
- 2.6.0 (PyPI's aarch64 wheel was its CPU build, BLAS OpenBLAS): torch.libs/ under auditwheel's hashed names
  (libgomp-98df74fd.so.1.0.0, libopenblasp-r0-bbd0e64a.3.28.so, ...), the aarch64 CPU row and the OpenBLAS row.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kit import realtrees
from test_runtime_libraries import elf_of, matches, upstream_bundled

from torchkiln.recipe import runtime_libraries

pytestmark = pytest.mark.integration
AARCH64 = "manylinux_2_28_aarch64"


@pytest.mark.parametrize(
    ("requirement", "python", "build"),
    [
        ("torch===2.13.0", "3.12", ("aarch64", "cuda", "nvpl")),
        ("torch==2.6.0", "3.11", ("aarch64", "cpu", "openblas")),
    ],
    ids=["2.13.0+cu130-nvpl", "2.6.0-cpu-openblas"],
)
def test_upstreams_aarch64_wheels_carry_the_tables_sonames(
    requirement: str, python: str, build: tuple[str, str, str], tmp_path: Path
) -> None:
    wheel = realtrees.pypi_wheel(requirement, python_version=python, platform=AARCH64)
    carried = upstream_bundled(wheel, tmp_path)
    assert matches(set(runtime_libraries.sonames(*build)), carried), carried


def test_upstreams_2_13_aarch64_copies_carry_its_cuda_rpath_then_origin(tmp_path: Path) -> None:
    """What torchkiln's CUDA repair writes on every file of torch/lib (tests/test_runtime_libraries.py checks
    it against the x86_64 cu130 wheel's libgomp.so.1): the aarch64 wheel's copies have it too."""
    wheel = realtrees.pypi_wheel("torch===2.13.0", python_version="3.12", platform=AARCH64)
    searches = {
        name: elf_of(wheel, f"torch/lib/{name}", tmp_path).search
        for name in runtime_libraries.sonames("aarch64", "cuda", "nvpl")
    }
    gomp = searches["libgomp.so.1"]
    assert gomp[0] == "RPATH" and gomp[1][-1] == "$ORIGIN" and "$ORIGIN/../../nvidia/cu13/lib" in gomp[1]
    assert set(searches.values()) == {gomp}, searches
