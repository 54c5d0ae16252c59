"""The version a wheel is labelled with is the version its tree states: checked on the tree itself.

A compile step labels its wheel through its environment (``PYTORCH_BUILD_VERSION`` for torch,
``BUILD_VERSION`` for torchvision, from the recipe: torchkiln.plan.environment). Before the step runs, and
right after the fetch steps left a checkout, the tree's own ``version.txt`` must name the label's release
(:func:`torchkiln.source.version.label_problem`): a ``--source-dir`` tree, a fetched ref that is not the release
the recipe says, ``--no-preflight``, ``--only``, ``--torch``, ``--skip-postcheck`` alike. Host checks can be
skipped; this one cannot. A step that sets no label builds the version its tree states (the build script
reads version.txt itself): nothing to check. The publish step checks every compile's label once more and
records the version file as read beside it (:func:`version_record`: the manifest, the lock file, the
provenance).
"""

from __future__ import annotations

from pathlib import Path

from torchkiln.artifacts.lockfile import VersionRecord
from torchkiln.errors import BuildFailed
from torchkiln.plan.model import Plan, Source, Step
from torchkiln.source.version import LABEL_VARIABLES, label_problem, record


def label_of(step: Step) -> str | None:
    """The version ``step`` labels its wheel with (None: it sets none)."""
    variable = LABEL_VARIABLES.get(step.project)
    return step.env.get(variable) if variable else None


def check_label(step: Step, tree: Path, outcome: str = "nothing was compiled", at: str | None = None) -> None:
    """Raise BuildFailed naming the tree's version file when ``step``'s label is not what the tree states
    (torchkiln.source.version's table); ``at``: the step that refuses (``step`` itself by default)."""
    label = label_of(step)
    if label is None:
        return
    problem = label_problem(step.project, tree, label)
    if problem:
        raise BuildFailed(
            f"{step.name}: {problem}; {outcome}\nways out: check out the release the recipe names "
            f"({step.project}.ref), fix {step.project}.version in the recipe, or build a --source-dir tree "
            f"at its own version with --accept-source-version {step.project}",
            step=at or step.name,
        )


def version_record(plan: Plan, source: Source) -> VersionRecord:
    """At publish: every compile of ``source``'s tree checked again against its version file as it is now
    (BuildFailed, nothing published, when one no longer agrees), and the record of that file beside the
    label."""
    label = None
    for step in (s for s in plan.steps if s.kind == "compile" and s.project == source.name):
        check_label(step, source.path, "nothing was published (dist/ is unchanged)", "publish")
        label = label if label is not None else label_of(step)
    return record(source.name, source.path, label)
