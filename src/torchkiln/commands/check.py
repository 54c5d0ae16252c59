"""``torchkiln check RECIPE``: can this host build this recipe? Every reason it cannot, at once.

Takes the same options as ``torchkiln build`` (what is checked is what would be built): the recipe is
validated completely (every field, every rule), then the plan is resolved and the host checked against it
(:mod:`torchkiln.plan.preflight`). Exit 0 when a build could start; 2 with one line per problem otherwise.
``torchkiln build`` runs the same checks before its first step.
"""

from __future__ import annotations

import argparse
import time

from torchkiln.plan.model import Plan
from torchkiln.plan.preflight import preflight, require

from .plan import add_plan_arguments, plan_from_args


def register(parser: argparse.ArgumentParser) -> None:
    add_plan_arguments(parser)


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    plan = plan_from_args(args, "check")
    require(plan)  # raises PreflightError (exit 2) listing every problem
    r = plan.recipe
    checks = ", ".join(sorted(ALWAYS | _asked(plan)))
    print(
        f"{r.source}: ok: this host can build {', '.join(plan.projects)} of {r.name} "
        f"(torch {r.torch_wheel_version}, torchvision {r.torchvision_wheel_version}; checked {checks}; "
        f"{time.monotonic() - started:.1f} s)"
    )
    for note in plan.notes:
        print(f"  note: {note}")
    return 0


# The checks every plan gets (torchkiln.plan.preflight.CHECKS); _asked adds those a plan's choices ask for.
ALWAYS = frozenset(
    {"platform", "python", "python-headers", "cxx", "cc", "compiler", "git", "disk", "memory", "source"}
)


def _asked(plan: Plan) -> set[str]:
    recipe = plan.recipe
    out = {"nvcc"} if recipe.accelerator.is_cuda else set()
    if recipe.accelerator.is_cuda and "torch" in plan.projects:
        out |= {"cudnn", "nccl"}  # torch's: torchvision compiles against neither
    if plan.cache.enabled:
        out.add("cache")
    if any(s.provided for s in plan.sources):
        out.add("submodules")
    if recipe.magma is not None:
        out.add("magma")
    if recipe.blas.kind in ("openblas", "nvpl"):
        out.add("blas")
    if "torchvision" in plan.projects:  # each part of [torchvision.features] asked for, by its field name
        out |= {f"torchvision.features.{part}" for part in recipe.vision.enabled}
    return out


__all__ = ["preflight", "register", "run"]
