"""The version a wheel is labelled with is the version its tree states: checked on the tree itself.

A compile step labels its wheel through its environment (``PYTORCH_BUILD_VERSION`` for torch,
``BUILD_VERSION`` for torchvision, from the recipe: torchkiln.plan.environment). Before the step runs, and
right after the fetch steps left a checkout, the tree's own ``version.txt`` must name the label's release
(:func:`torchkiln.source.version.label_problem`): a ``--source-dir`` tree, a fetched ref that is not the release
the recipe says, ``--no-preflight``, ``--only``, ``--torch``, ``--skip-checks`` alike. Host checks can be
skipped; this one cannot. A step that sets no label builds the version its tree states (the build script
reads version.txt itself): nothing to check.
"""

from __future__ import annotations

from pathlib import Path

from torchkiln.errors import BuildFailed
from torchkiln.plan.model import Step
from torchkiln.source.version import LABEL_VARIABLES, label_problem


def check_label(step: Step, tree: Path) -> None:
    """Raise BuildFailed naming the tree's version file when ``step``'s label is not the tree's release."""
    variable = LABEL_VARIABLES.get(step.project)
    label = step.env.get(variable) if variable else None
    if label is None:
        return
    problem = label_problem(step.project, tree, label)
    if problem:
        raise BuildFailed(
            f"{step.name}: {problem}; nothing was compiled\nways out: check out the release the recipe names "
            f"({step.project}.ref), fix {step.project}.version in the recipe, or build a --source-dir tree "
            f"at its own version with --accept-source-version {step.project}",
            step=step.name,
        )
