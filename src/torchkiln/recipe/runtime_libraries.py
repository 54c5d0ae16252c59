"""The runtime libraries a torch wheel carries in ``torch/lib``, as upstream's repair step bundles them.

A torch built from source with gcc links gcc's OpenMP runtime ``libgomp.so.1``; on aarch64 also libgfortran,
the BLAS (OpenBLAS or NVPL) and the Arm Compute Library where it was built. No manylinux policy allows any of
them, so a wheel that links one and does not carry it runs only where that library happens to be installed.
Upstream copies them into every wheel (``.ci/manywheel/build_cpu.sh`` / ``build_cuda.sh`` ``DEPS_LIST``,
``repair_wheel.py``); the ``torch:repair`` step of torchkiln's plan does the same with the build host's copies
(:mod:`torchkiln.artifacts.repair`).

The data (``data/compat.toml [runtime_libraries]``, each row with the upstream script that lists it and the
upstream wheel it was read off) has a row per platform and variant (``accelerator``: ``cpu`` / ``cuda``) and a
row per platform and BLAS (the shared BLAS libraries: OpenBLAS, NVPL; MKL is linked statically). A recipe gets
both of its rows: upstream's own four builds (x86_64 CPU and CUDA with MKL, aarch64 CPU with OpenBLAS, aarch64
CUDA with NVPL) get exactly upstream's lists, and a combination upstream does not build (aarch64 CUDA with
OpenBLAS) gets what its parts need.

The invariant: every library of a recipe's list that the wheel's shared objects need travels with the wheel;
a library outside the list that no policy allows is the post-build check's business (it names it).
"""

from __future__ import annotations

from typing import Any

from .compat import compat
from .model import Recipe


def _data() -> dict[str, Any]:
    data: dict[str, Any] = compat()["runtime_libraries"]
    return data


def rows() -> list[dict[str, Any]]:
    """The table's rows: ``platform``, ``accelerator`` or ``blas``, ``sonames``, ``source``, ``wheel``."""
    found: list[dict[str, Any]] = _data()["bundle"]
    return found


def sonames(platform: str, accelerator: str, blas: str) -> tuple[str, ...]:
    """The sonames a torch wheel of ``platform`` built for ``accelerator`` (``cpu`` / ``cuda``) with the
    BLAS ``blas`` carries: its accelerator row's, then its BLAS row's, each once, in the table's order."""
    names: list[str] = []
    for row in rows():
        if row["platform"] != platform:
            continue
        if row.get("accelerator") == accelerator or row.get("blas") == blas:
            names += row["sonames"]
    return tuple(dict.fromkeys(names))


def for_recipe(recipe: Recipe) -> tuple[str, ...]:
    """:func:`sonames` of the recipe's platform, accelerator and BLAS."""
    accelerator = "cuda" if recipe.accelerator.is_cuda else "cpu"
    return sonames(recipe.build.platform, accelerator, recipe.blas.kind)


def all_sonames() -> frozenset[str]:
    """Every soname of the table (any platform): the files of a torch wheel that are bundled copies, not its
    own libraries (the SBOM lists them as bundled components)."""
    return frozenset(name for row in rows() for name in row["sonames"])


def licence(soname: str) -> str | None:
    """The SPDX licence expression of ``soname`` where its Debian package's copyright file is not
    machine-readable (GCC's runtime libraries); None where the table has none."""
    found: str | None = _data()["licences"].get(soname)
    return found
