"""Compatibility rules, checked when a recipe loads and before any work starts.

The numbers live in ``data/compat.toml`` (with the upstream source of each); this module holds the rule
table, :data:`RULES`: the rule functions in the order they run, each declared with its row (the fields it
reads, what it requires) by :func:`~.rules_violations.rule` on its definition. A rule that
cannot apply (no CUDA, no MAGMA, an unknown release already reported) says nothing. The checks live by
subject: :mod:`.rules_versions` (torch, torchvision, Python, the wheel's version), :mod:`.rules_cuda` (CUDA,
cuDNN, NCCL, arch list, aarch64), :mod:`.rules_toolchain` (gcc, MAGMA, BLAS), :mod:`.rules_settings`
(build flags, cache, cluster); each yields findings (:data:`~.rules_findings.Finding`), none raises.
"""

from __future__ import annotations

from collections.abc import Collection

from torchkiln.errors import Problem

from .model import Recipe
from .rules_cuda import (
    _arch_vs_cuda,
    _cuda_fields,
    _cuda_range,
    _cudnn_min_sm,
    _cudnn_range,
    _deploy_cuda_libraries,
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
from .rules_violations import Rule, row

RULES: tuple[Rule, ...] = tuple(
    row(check)
    for check in (
        _known_torch,
        _vision_pairs_torch,
        _python_range,
        _free_threaded,
        _cuda_fields,
        _cuda_range,
        _cudnn_range,
        _nccl_for_cuda,
        _runtime_libraries,
        _arch_vs_cuda,
        _cudnn_min_sm,
        _gcc_range,
        _magma,
        _blas,
        _platform_blas,
        _platform_cuda,
        _platform_arch,
        _build_version_pair,
        _vision_features,
        _flags,
        _flags_known,
        _cache,
        _cluster,
        _deploy_cuda_libraries,
    )
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
