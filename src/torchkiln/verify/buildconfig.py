"""Whether a torch build is what its recipe asked for, and agrees with itself.

A source build can silently lose a feature: CUDA compiled out because nvcc was not found, cuDNN not
picked up, MKL replaced by a fallback BLAS, an arch missing from ``TORCH_CUDA_ARCH_LIST``. The build
still "succeeds". The facts a build reports about itself are gathered by :mod:`torchkiln.verify.facts`
(standard library only, so the build's post-build check runs it in a clean venv too); this module
compares them with a recipe: every mismatch is a :class:`Comparison` that names the recipe field, the
expected and the actual value. The verification suite and ``torchkiln build``'s post-build check both
call :func:`recipe_checks` / :func:`.buildconfig_torchvision.torchvision_checks`: one comparison, not two
copies.

The checks of each library are in their own module (:mod:`.buildconfig_versions`, ``_cuda``,
``_cudnn_nccl``, ``_blas``, ``_compiler``, ``_torchvision``; each a :class:`.comparison.Comparison`); this one puts
them together: :func:`self_checks`, and :data:`RECIPE_TABLE`, each recipe check's id and function.

Pure Python; nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from packaging.version import Version

from torchkiln.recipe.model import Recipe

from . import facts as _facts
from .buildconfig_blas import _blas_vs_recipe, _magma_vs_recipe, _mkl_vs_recipe, magma_check
from .buildconfig_compiler import (
    _build_type_vs_recipe,
    _compiler_vs_recipe,
    _flags_vs_recipe,
    _platform_vs_recipe,
    cxx11_abi_check,
    wheel_tag_check,
)
from .buildconfig_cuda import _arch_list_vs_recipe, _cuda_version_vs_recipe, _use_cuda_vs_recipe
from .buildconfig_cudnn_nccl import (
    _cudnn_runtime_vs_recipe,
    _cudnn_vs_recipe,
    _nccl_runtime_vs_recipe,
    _nccl_vs_recipe,
    cudnn_runtime_check,
    nccl_check,
    nvidia_packages_check,
)
from .buildconfig_torchvision import torchvision_checks
from .buildconfig_versions import (
    _commit_vs_recipe,
    _local_label_vs_recipe,
    _python_vs_recipe,
    _torch_version_vs_recipe,
)
from .comparison import Comparison, _cmp, _skip, flag
from .facts import BuildFacts, TorchvisionFacts, decode_cudnn, dotted, parse_build_settings

__all__ = [
    "BuildFacts",
    "TorchvisionFacts",
    "collect_facts",
    "decode_cudnn",
    "dotted",
    "parse_build_settings",
    "recipe_checks",
    "self_checks",
]


def collect_facts() -> BuildFacts:
    """The importable torch's facts (:func:`torchkiln.verify.facts.collect_facts`, standard library only)
    and what the ELF files of the torch ``import`` loads say about NCCL and MAGMA (:mod:`torchkiln.verify.linkage`,
    with pyelftools)."""
    from . import imported, linkage  # pyelftools: imported when the suite asks, not by the post-build check

    found = _facts.collect_facts()
    index = linkage.installed()
    installed = index.get("torch")
    if installed is None:  # a torch not installed as a distribution (a source tree on sys.path)
        return found
    # the libraries of the torch that is imported: a copy shadowing the installed one is what runs
    torch_dist = imported.as_distribution(imported.find("torch", installed), installed)
    linked = linkage.check_distribution(torch_dist, index, linkage.System.of_this_machine())
    return dataclasses.replace(found, **linkage.library_facts(torch_dist, linked))  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# Checks that need no recipe: the build agrees with itself and with what PyTorch's own binary checks
# (smoke_test.py, check_binary.sh) require of every build.
# --------------------------------------------------------------------------------------------------

SELF_CHECKS = (
    "settings_version",
    "settings_cuda",
    "git_version",
    "commit_sha",
    "cxx11_abi",
    "openmp",
    "mkl_runtime",
    "cudnn_settings",
    "cudnn_in_cuda_build",
    "cudnn_runtime",
    "nccl_in_cuda_build",
    "magma_linked",
    "nvidia_packages",
    "wheel_tag",
)


def self_checks(facts: BuildFacts) -> dict[str, Comparison]:
    s = facts.settings
    out: dict[str, Comparison] = {}
    base = Version(facts.torch_version).public
    if "TORCH_VERSION" in s:
        out["settings_version"] = _cmp(
            "settings_version",
            "Build settings TORCH_VERSION vs torch.__version__",
            base,
            s["TORCH_VERSION"],
            ok=Version(s["TORCH_VERSION"]).base_version == Version(base).base_version,
        )
    else:
        out["settings_version"] = Comparison(
            "settings_version", "fail", "Build settings have no TORCH_VERSION"
        )
    use_cuda = flag(s.get("USE_CUDA"))
    out["settings_cuda"] = _cmp(
        "settings_cuda",
        "USE_CUDA in Build settings, torch.version.cuda and torch.backends.cuda.is_built() agree",
        f"all {'on' if use_cuda else 'off'}",
        f"USE_CUDA={s.get('USE_CUDA')}, torch.version.cuda={facts.cuda_version}, is_built={facts.cuda_built}",
        ok=bool(use_cuda) == (facts.cuda_version is not None) == facts.cuda_built,
    )
    out["git_version"] = _cmp(
        "git_version",
        "torch.version.git_version",
        "a commit, not 'Unknown'",
        facts.git_version,
        ok=facts.git_version not in (None, "", "Unknown"),
    )
    if "COMMIT_SHA" in s and facts.git_version not in (None, "", "Unknown"):
        out["commit_sha"] = _cmp(
            "commit_sha",
            "Build settings COMMIT_SHA vs torch.version.git_version",
            facts.git_version,
            s["COMMIT_SHA"],
        )
    else:
        out["commit_sha"] = _skip("commit_sha", "Build settings carry no COMMIT_SHA to compare")
    out["cxx11_abi"] = cxx11_abi_check(facts)
    out["openmp"] = _cmp("openmp", "torch.backends.openmp.is_available()", True, facts.openmp_available)
    if s.get("BLAS_INFO") == "mkl":
        out["mkl_runtime"] = _cmp(
            "mkl_runtime", "BLAS_INFO=mkl but torch.backends.mkl.is_available()", True, facts.mkl_available
        )
    else:
        out["mkl_runtime"] = _skip("mkl_runtime", f"BLAS_INFO={s.get('BLAS_INFO')}: not an MKL build")
    if facts.cudnn_compile is not None and s.get("CUDNN_VERSION"):
        out["cudnn_settings"] = _cmp(
            "cudnn_settings",
            "Build settings CUDNN_VERSION vs compiled cuDNN",
            dotted(facts.cudnn_compile),
            s["CUDNN_VERSION"],
        )
    else:
        out["cudnn_settings"] = _skip("cudnn_settings", "torch was built without cuDNN")
    if facts.cuda_version is not None:  # check_binary.sh: every CUDA build has cuDNN
        out["cudnn_in_cuda_build"] = _cmp(
            "cudnn_in_cuda_build",
            f"cuDNN compiled into a CUDA {facts.cuda_version} build (torch.backends.cudnn.is_available())",
            True,
            facts.cudnn_available,
        )
    else:
        out["cudnn_in_cuda_build"] = _skip("cudnn_in_cuda_build", "not a CUDA build")
    out["cudnn_runtime"] = cudnn_runtime_check(facts)
    out["nccl_in_cuda_build"] = nccl_check(facts)
    out["magma_linked"] = magma_check(facts)
    out["nvidia_packages"] = nvidia_packages_check(facts)
    out["wheel_tag"] = wheel_tag_check(facts)
    return out


# --------------------------------------------------------------------------------------------------
# Checks against a recipe: the build has what the recipe asked for.
# --------------------------------------------------------------------------------------------------

RecipeCheck = Callable[[Recipe, BuildFacts, str | None], Comparison]


def _facts_only(check: Callable[[Recipe, BuildFacts], Comparison]) -> RecipeCheck:
    """A check of the recipe against the facts alone, as a row of :data:`RECIPE_TABLE` (whose checks may
    also read the commit torch was built from)."""
    return lambda recipe, facts, commit: check(recipe, facts)


# Each recipe check's id (the key of its result; reports list them in this order) and its function of the
# recipe, the build's facts and the commit torch was built from (compared where the recipe pins none).
RECIPE_TABLE: tuple[tuple[str, RecipeCheck], ...] = (
    ("torch_version", _facts_only(_torch_version_vs_recipe)),
    ("local_label", _facts_only(_local_label_vs_recipe)),
    ("build_type", _facts_only(_build_type_vs_recipe)),
    ("use_cuda", _facts_only(_use_cuda_vs_recipe)),
    ("cuda_version", _facts_only(_cuda_version_vs_recipe)),
    ("cudnn", _facts_only(_cudnn_vs_recipe)),
    ("cudnn_runtime", _facts_only(_cudnn_runtime_vs_recipe)),
    ("nccl", _facts_only(_nccl_vs_recipe)),
    ("nccl_runtime", _facts_only(_nccl_runtime_vs_recipe)),
    ("blas", _facts_only(_blas_vs_recipe)),
    ("mkl_version", _facts_only(_mkl_vs_recipe)),
    ("magma", _facts_only(_magma_vs_recipe)),
    ("arch_list", _facts_only(_arch_list_vs_recipe)),
    ("git_commit", _commit_vs_recipe),
    ("flags", _facts_only(lambda recipe, facts: _flags_vs_recipe(recipe.build.flags, facts.settings))),
    ("python", _facts_only(_python_vs_recipe)),
    ("compiler", _facts_only(_compiler_vs_recipe)),
    ("platform", _facts_only(_platform_vs_recipe)),
)
RECIPE_CHECKS = tuple(check_id for check_id, _ in RECIPE_TABLE)


def recipe_checks(recipe: Recipe, facts: BuildFacts, *, commit: str | None = None) -> dict[str, Comparison]:
    """Compare a build with its recipe. Keys are :data:`RECIPE_CHECKS`. ``commit``: the commit torch was
    built from (its checkout's HEAD, or a manifest's source), compared when the recipe pins none."""
    return {check_id: check(recipe, facts, commit) for check_id, check in RECIPE_TABLE}


def postbuild_checks(
    recipe: Recipe,
    facts: BuildFacts,
    projects: tuple[str, ...],
    *,
    commits: Mapping[str, str] | None = None,
) -> dict[str, Comparison]:
    """What ``torchkiln build``'s post-build check compares: the recipe checks of each project it built
    (``torch.<id>``, ``torchvision.<id>``), the same functions the verification suite runs. ``commits``:
    project -> the commit its checkout was at (compared where the recipe pins none)."""
    commits = commits or {}
    results: dict[str, Comparison] = {}
    if "torch" in projects:
        checks = recipe_checks(recipe, facts, commit=commits.get("torch"))
        results.update({f"torch.{k}": c for k, c in checks.items()})
    if "torchvision" in projects:
        checks = torchvision_checks(recipe, facts, commit=commits.get("torchvision"))
        results.update({f"torchvision.{k}": c for k, c in checks.items()})
    return results
