"""Compatibility rules, checked when a recipe loads and before any work starts.

The numbers live in ``data/compat.toml`` (with the upstream source of each); this module holds the rule
table, :data:`RULES`: one row per rule, naming the field it reports on and what it requires. A rule that
cannot apply (no CUDA, no MAGMA, an unknown release already reported) says nothing. The checks live by
subject: :mod:`.rules_versions` (torch, torchvision, Python, the wheel's version), :mod:`.rules_cuda` (CUDA,
cuDNN, NCCL, arch list, aarch64), :mod:`.rules_toolchain` (gcc, MAGMA, BLAS), :mod:`.rules_settings`
(build flags, cache, dist); each yields findings (:data:`~.rules_findings.Finding`), none raises.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

from torchkiln.errors import Problem

from . import cuda_libraries
from .model import Recipe
from .rules_cuda import (
    _arch_vs_cuda,
    _cuda_fields,
    _cuda_range,
    _cudnn_min_sm,
    _cudnn_range,
    _nccl_for_cuda,
    _platform_arch,
    _platform_cuda,
    _runtime_libraries,
)
from .rules_settings import _cache, _cluster, _flags, _flags_known
from .rules_toolchain import _blas, _gcc_range, _magma, _platform_blas
from .rules_versions import (
    _build_version_pair,
    _free_threaded,
    _known_torch,
    _python_range,
    _vision_features,
    _vision_pairs_torch,
)
from .rules_violations import Violation

RuleFunction = Callable[[Recipe], Iterator[Violation]]


@dataclass(frozen=True)
class Rule:
    """One rule: ``reads`` names the fields (or whole tables) it looks at; when one of them is itself
    malformed, the rule is not run (its finding would only echo that problem), every other rule is."""

    id: str
    summary: str
    check: RuleFunction
    reads: tuple[str, ...]

    def blocked_by(self, bad: Collection[str]) -> bool:
        return any(r == b or r.startswith(b + ".") or b.startswith(r + ".") for r in self.reads for b in bad)


RULES: tuple[Rule, ...] = (
    Rule("torch-known", "the torch release has compatibility data", _known_torch, ("torch.version",)),
    Rule(
        "torchvision-pairs-torch",
        "torchvision pairs with torch as data/compat.toml says (0.(N+15) with 2.N up to 2.14)",
        _vision_pairs_torch,
        ("torch.version", "torchvision.version"),
    ),
    Rule(
        "python-range",
        "Python is within the torch release's supported range",
        _python_range,
        ("torch.version", "python"),
    ),
    Rule(
        "python-free-threaded",
        "a free-threaded Python (3.13t) only where the torch release ships wheels for it",
        _free_threaded,
        ("torch.version", "python"),
    ),
    Rule(
        "cuda-fields",
        "CUDA builds name cuda, arch_list, cudnn, nccl; CPU builds none of them",
        _cuda_fields,
        ("accelerator",),
    ),
    Rule(
        "cuda-range",
        "CUDA is within the torch release's range",
        _cuda_range,
        ("torch.version", "accelerator.cuda"),
    ),
    Rule(
        "cudnn-range",
        "cuDNN is within the torch release's range and built for the CUDA major",
        _cudnn_range,
        ("torch.version", "accelerator.cuda", "accelerator.cudnn"),
    ),
    Rule(
        "nccl-for-cuda",
        "NCCL has a build for the CUDA major",
        _nccl_for_cuda,
        ("accelerator.cuda", "accelerator.nccl"),
    ),
    Rule(
        "runtime-libraries",
        "the cuDNN / NCCL a wheel runs with can run what it is compiled against",
        _runtime_libraries,
        ("accelerator",),
    ),
    Rule(
        "arch-vs-cuda",
        "every arch entry can be targeted by the recipe's nvcc",
        _arch_vs_cuda,
        ("accelerator.cuda", "accelerator.arch_list"),
    ),
    Rule(
        "cudnn-min-sm",
        "cuDNN >= 9.11 with no arch below SM 7.5",
        _cudnn_min_sm,
        ("accelerator.cudnn", "accelerator.arch_list"),
    ),
    Rule(
        "gcc-range",
        "host gcc is new enough for torch and old enough for nvcc",
        _gcc_range,
        ("build.gcc", "torch.version", "accelerator.cuda"),
    ),
    Rule(
        "magma",
        "MAGMA only with CUDA, with version and sha256, in the torch release's range",
        _magma,
        ("magma", "accelerator.kind", "torch.version"),
    ),
    Rule("blas", "MKL builds name the MKL version", _blas, ("blas",)),
    Rule(
        "platform-blas",
        "the BLAS exists on the platform (MKL x86_64 only, NVPL aarch64 only)",
        _platform_blas,
        ("blas.kind", "build.platform"),
    ),
    Rule(
        "platform-cuda",
        "an aarch64 CUDA has sbsa toolkit wheels and upstream aarch64 wheels",
        _platform_cuda,
        ("build.platform", "accelerator.cuda"),
    ),
    Rule(
        "platform-arch",
        "an aarch64 arch list names only what upstream's aarch64 wheels build",
        _platform_arch,
        ("build.platform", "accelerator.cuda", "accelerator.arch_list"),
    ),
    Rule(
        "build-version-pair",
        "PYTORCH_BUILD_VERSION and PYTORCH_BUILD_NUMBER together or not at all",
        _build_version_pair,
        (
            "build.pytorch_build_version",
            "build.pytorch_build_number",
            "build.local_version",
            "torch.version",
        ),
    ),
    Rule(
        "torchvision-features",
        "nvJPEG and the GPU video decoder need CUDA; no video decoders from torchvision 0.24",
        _vision_features,
        ("torchvision.features", "accelerator.kind", "torchvision.version"),
    ),
    Rule("flags", "build.flags does not override what recipe fields decide", _flags, ("build.flags",)),
    Rule(
        "flags-known",
        "build.flags are options the torch release reads, with values of their type",
        _flags_known,
        ("build.flags", "torch.version"),
    ),
    Rule(
        "cache", "cache settings are consistent, usable by the plan and hold no secrets", _cache, ("cache",)
    ),
    Rule(
        "cluster",
        "distributed compiles name a scheduler and use sccache",
        _cluster,
        ("cluster", "cache.kind"),
    ),
    Rule(
        "deploy-cuda-libraries",
        "a CUDA wheel's CUDA libraries come from NVIDIA's wheels, or are bundled where upstream bundles them",
        cuda_libraries.problems,
        ("deploy", "accelerator", "torch.version"),
    ),
)


def check_rules(recipe: Recipe, file: str, skip: Collection[str] = ()) -> list[Problem]:
    """Every rule's findings; a rule that reads a field in ``skip`` (already reported as malformed) is not
    run."""
    return [
        Problem(file, *finding)
        for rule in RULES
        if not rule.blocked_by(skip)
        for finding in rule.check(recipe)
    ]
