"""Build-config checks of CUDA: compiled in as the recipe asks (or left out of a CPU recipe's build), its
version, and the architectures compiled for (``TORCH_CUDA_ARCH_LIST``)."""

from __future__ import annotations

from torchkiln.recipe.archs import expected_arch_list
from torchkiln.recipe.model import Recipe

from .comparison import Comparison, _cmp, _release, _version_or_none, flag
from .facts import BuildFacts


def _use_cuda_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Comparison:
    s, acc = facts.settings, recipe.accelerator
    use_cuda = bool(flag(s.get("USE_CUDA")))
    return _cmp(
        "use_cuda",
        "USE_CUDA (CUDA compiled in)",
        f"USE_CUDA=ON (recipe asks for CUDA {acc.cuda})" if acc.is_cuda else "USE_CUDA=OFF (CPU recipe)",
        f"USE_CUDA={s.get('USE_CUDA', '(absent)')}, torch.version.cuda={facts.cuda_version}",
        ok=use_cuda == acc.is_cuda and (facts.cuda_version is not None) == acc.is_cuda,
        field="accelerator.kind",
    )


def _cuda_version_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Comparison:
    acc = recipe.accelerator
    what = "CUDA version (torch.version.cuda)"
    if not (acc.is_cuda and acc.cuda is not None):
        return _cmp("cuda_version", what, None, facts.cuda_version, field="accelerator.cuda")
    got = _version_or_none(facts.cuda_version)
    return _cmp(
        "cuda_version",
        what,
        f"{acc.cuda}",
        facts.cuda_version,
        ok=got is not None and _release(got, 2) == _release(acc.cuda, 2),
        field="accelerator.cuda",
    )


def _arch_list_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Comparison:
    acc = recipe.accelerator
    want_archs = expected_arch_list(acc.arch_list) if acc.is_cuda else set()
    got_archs = set(facts.arch_list)
    missing, extra = sorted(want_archs - got_archs), sorted(got_archs - want_archs)
    detail = f" (missing {missing}, unexpected {extra})" if missing or extra else ""
    return _cmp(
        "arch_list",
        f"{facts.arch_source} vs TORCH_CUDA_ARCH_LIST{detail}",
        sorted(want_archs),
        sorted(got_archs),
        ok=want_archs == got_archs,
        field="accelerator.arch_list",
    )
