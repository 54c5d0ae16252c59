"""A plan labels each wheel with a version (``PYTORCH_BUILD_VERSION``, ``BUILD_VERSION``); every tree it
already has must state that version (:func:`torchkiln.source.version.label_problem`).

``plan`` and ``build`` run :func:`require_labels` for the trees given with ``--source-dir`` whatever else
they skip (``--no-preflight`` skips host checks only), so ``plan`` never shows a version over a tree that says
another; ``check`` reports the same mismatch among its host findings (torchkiln.plan.preflight, ``source``).
A fetched tree does not exist yet: the build checks it after the fetch and again right before its compile
(torchkiln.build.treelabel), as it does every tree.
"""

from __future__ import annotations

from torchkiln.errors import UsageError
from torchkiln.source.version import LABEL_VARIABLES, label_problem

from .model import Plan


def label_problems(plan: Plan) -> list[str]:
    """For each given tree, each compile step whose label its version.txt does not state: why."""
    problems: list[str] = []
    for source in plan.sources:
        if not source.provided:
            continue
        for step in plan.steps:
            label = step.env.get(LABEL_VARIABLES.get(step.project, ""))
            if step.kind != "compile" or step.project != source.name or label is None:
                continue
            problem = label_problem(source.name, source.path, label)
            if problem and problem not in problems:
                problems.append(problem)
    return problems


def require_labels(plan: Plan) -> None:
    problems = label_problems(plan)
    if problems:
        lines = "\n".join(problems)
        raise UsageError(
            f"{lines}\nnothing was planned: a wheel is labelled with the version its tree states (valid: a "
            "tree at the recipe's release, or --accept-source-version PROJECT to build the tree's own version)"
        )
