"""The compatibility data: what each torch release and CUDA version accepts (``data/compat.toml``).

The numbers live in the data file, each with the upstream source it was read from. Two sides read them: the
recipe rules (:mod:`torchkiln.recipe.rules`), which refuse a recipe before any work starts, and the
verification suite (:mod:`torchkiln.verify`), which runs on a GPU host that has only the wheels, the manifest
and the recipe. So this module needs nothing but the recipe model.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from torchkiln.errors import UsageError
from torchkiln.shipped import shipped_toml

from .model import Recipe


@cache
def compat() -> dict[str, Any]:
    """The compatibility data shipped with torchkiln."""
    return shipped_toml("compat.toml")


def minor(version: Version) -> str:
    return f"{version.major}.{version.minor}"


def vision_pairing(release: dict[str, Any]) -> str:
    """The torchvision a torch release (its compat.toml row) pairs with, as a finding's valid values say it:
    ``0.28.x``, or ``0.29.x from 0.29.2`` where the row names a first release (``torchvision_min``)."""
    first = release.get("torchvision_min")
    return f"{release['torchvision']}.x" + (f" from {first}" if first else "")


def vision_pairs(release: dict[str, Any], torchvision: Version) -> bool:
    """Whether ``torchvision`` is of the minor the torch release pairs with (0.(N+15) for 2.N up to 2.14; 0.29
    for 2.15, a stable-ABI torchvision) and not before the row's first torchvision of it."""
    first = release.get("torchvision_min")
    return minor(torchvision) == release["torchvision"] and (first is None or torchvision >= Version(first))


def torch_release(recipe: Recipe) -> dict[str, Any] | None:
    release: dict[str, Any] | None = compat()["torch"].get(minor(recipe.torch.version))
    return release


def cuda_release(recipe: Recipe) -> dict[str, Any] | None:
    cuda = recipe.accelerator.cuda
    return compat()["cuda"].get(minor(cuda)) if cuda is not None else None


def frontend(recipe: Recipe) -> str:
    """'setup.py' or 'scikit-build-core': how this torch release builds its wheel (data/compat.toml: setup.py
    up to 2.13, scikit-build-core from 2.14). A release without data has no front end to guess: the rules
    refuse it before anything is planned, and this refuses it by name if it gets here anyway."""
    release = torch_release(recipe)
    if release is None:
        raise UsageError(
            f"torch {recipe.torch.version}: no compatibility data, so how it builds its wheel (setup.py or "
            f"scikit-build-core) is not known (valid: data/compat.toml has {torch_release_range()})"
        )
    frontend: str = release["frontend"]
    return frontend


def platforms() -> list[str]:
    """The platforms a recipe may name (``build.platform``): data/compat.toml's ``[platform.*]`` tables."""
    return list(compat()["platform"])


def image_platforms() -> list[str]:
    """The platforms `torchkiln images` makes images for (``images = true`` in their ``[platform.*]`` table)."""
    return [name for name, table in compat()["platform"].items() if table.get("images")]


def image_problem(recipe: Recipe, flavour: str) -> str | None:
    """Why torchkiln makes no ``flavour`` image (devel, wheels, runtime) of ``recipe`` (None: it makes one):
    its platform has no images, or (devel, wheels) the devel image cannot install its BLAS (``image_blas``)."""
    made = image_platforms()
    if recipe.build.platform not in made:
        return (
            f"{recipe.source}: build.platform: torchkiln makes {', '.join(made)} images only "
            f"(valid: a recipe for {', '.join(made)})"
        )
    blas = platform_data(recipe)["image_blas"]
    if flavour != "runtime" and recipe.blas.kind not in blas:
        return (
            f"{recipe.source}: blas.kind: the {flavour} image of a recipe for {recipe.build.platform} cannot install "
            f"{recipe.blas.kind!r} (valid: {', '.join(map(repr, blas))}; the runtime image needs no BLAS of "
            "its own: the wheel bundles it)"
        )
    return None


def platform_data(recipe: Recipe) -> dict[str, Any]:
    """The recipe's ``[platform.<build.platform>]`` table (the schema admits only platforms that have one)."""
    data: dict[str, Any] = compat()["platform"][recipe.build.platform]
    return data


def blas_kind(kind: str) -> dict[str, str]:
    """``[blas.<kind>]``: the BLAS value PyTorch's CMake is given (``cmake``), the BLAS_INFO it reports
    (``info``) and the library's name in messages (``name``)."""
    data: dict[str, str] = compat()["blas"][kind]
    return data


def torch_releases() -> list[str]:
    """The torch releases (``2.13``) there is compatibility data for, oldest first."""
    return sorted(compat()["torch"], key=Version)


def torch_release_range() -> str:
    """Those releases in words, from the data: ``torch 2.10 to 2.15`` when they run without a gap, else
    each one (``torch 2.6, 2.8, 2.10``)."""
    releases = torch_releases()
    minors = [Version(r).minor for r in releases]
    same_major = len({Version(r).major for r in releases}) == 1
    if len(releases) > 1 and same_major and minors == list(range(minors[0], minors[0] + len(minors))):
        return f"torch {releases[0]} to {releases[-1]}"
    return "torch " + ", ".join(releases)


def supported_pythons(release: dict[str, Any]) -> list[str]:
    """Every Python a torch release (a ``[torch."2.N"]`` table) supports: each 3.N in its ``python`` range,
    then its free-threaded ones (``free_threaded``), as a recipe's python.version names them."""
    spec = SpecifierSet(release["python"])
    return [f"3.{n}" for n in range(40) if Version(f"3.{n}") in spec] + list(release["free_threaded"])
