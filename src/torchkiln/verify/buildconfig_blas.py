"""Build-config checks of the maths libraries: the BLAS (MKL, OpenBLAS or NVPL, as ``BLAS_INFO`` says),
MKL's version, and MAGMA (compiled in, and linked into torch's CUDA linear algebra)."""

from __future__ import annotations

from torchkiln.recipe.compat import blas_kind
from torchkiln.recipe.model import Recipe

from .comparison import Comparison, _cmp, _release, _skip, _version_or_none
from .facts import BuildFacts


def magma_check(facts: BuildFacts) -> Comparison:
    """``torch.cuda.has_magma`` (compiled in) agrees with the library that does CUDA linear algebra: MAGMA's
    symbols are in it (static, as upstream links it) or it needs a libmagma. check_binary.sh asks for
    has_magma only; this also catches the flag without the code (or the code without the flag)."""
    if facts.cuda_version is None:
        return _skip("magma_linked", "not a CUDA build")
    if not facts.libraries_read:
        return _skip(
            "magma_linked", "torch's libraries were not read (torch is not an installed distribution)"
        )
    return _cmp(
        "magma_linked",
        f"torch.cuda.has_magma={facts.has_magma} vs the MAGMA linked into torch's CUDA linear algebra",
        "MAGMA linked" if facts.has_magma else "no MAGMA",
        f"MAGMA {facts.magma_linkage}" if facts.magma_linkage else "no MAGMA symbols and no libmagma NEEDED",
        ok=facts.has_magma == (facts.magma_linkage is not None),
    )


def _blas_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Comparison:
    s = facts.settings
    if recipe.blas.kind == "mkl":
        return _cmp(
            "blas",
            "BLAS (Build settings BLAS_INFO, torch.backends.mkl.is_available())",
            "BLAS_INFO=mkl, MKL available",
            f"BLAS_INFO={s.get('BLAS_INFO')}, MKL available={facts.mkl_available}",
            ok=s.get("BLAS_INFO") == "mkl" and facts.mkl_available,
            field="blas.kind",
        )
    # OpenBLAS reports BLAS_INFO=open (cmake/Modules/FindBLAS.cmake), NVPL nvpl (compat.toml [blas.*]).
    kind = blas_kind(recipe.blas.kind)
    return _cmp(
        "blas",
        "BLAS (Build settings BLAS_INFO)",
        f"BLAS_INFO={kind['info']} ({kind['name']})",
        f"BLAS_INFO={s.get('BLAS_INFO')}",
        ok=s.get("BLAS_INFO", "").startswith(kind["info"]),
        field="blas.kind",
    )


def _mkl_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Comparison:
    """blas.mkl vs the MKL version torch.__config__.show() reports ("... Library Version 2024.2-Product
    Build ..."): MAJOR.MINOR, which is all torch prints."""
    if recipe.blas.kind != "mkl" or recipe.blas.mkl is None:
        return _skip("mkl_version", f"the recipe builds with {recipe.blas.kind}, not MKL", field="blas.mkl")
    want = ".".join(str(p) for p in _release(recipe.blas.mkl, 2))
    got = _version_or_none(facts.mkl_version)
    return _cmp(
        "mkl_version",
        "MKL version (torch.__config__.show())",
        want,
        facts.mkl_version,
        ok=got is not None and _release(got, 2) == _release(recipe.blas.mkl, 2),
        field="blas.mkl",
    )


def _magma_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Comparison:
    wanted = recipe.magma is not None
    return _cmp(
        "magma",
        "MAGMA (torch.cuda.has_magma)",
        f"{wanted} (recipe {'pins MAGMA ' + str(recipe.magma.version) if recipe.magma else 'has no [magma]'})",
        facts.has_magma,
        ok=facts.has_magma == wanted,
        field="magma",
    )
