"""A ``--source-dir`` tree's version against the recipe's, and the recipe rewritten to the tree's version
where the user accepts it (``--accept-source-version``): recipe adoption, which ``plan``, ``check``, ``build``
and ``reproduce`` run before a plan is made; apart from the host checks (:mod:`torchkiln.plan.preflight`),
whose ``source`` check reports a mismatch not accepted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from torchkiln.errors import Problem
from torchkiln.recipe.model import Recipe
from torchkiln.recipe.rules import check_rules
from torchkiln.source.version import TreeVersion, tree_version

# Where each project's tree states its version, and reading it: torchkiln.source.version (the build checks
# every tree against its wheel's label there too, whatever skips the host checks).


def source_versions(recipe: Recipe, source_dirs: Mapping[str, Path]) -> dict[str, TreeVersion]:
    """Per given tree whose version file disagrees with the recipe's release (or has none): what it says."""
    out: dict[str, TreeVersion] = {}
    for project, source in source_dirs.items():
        found = tree_version(project, Path(source))
        if found.release != recipe.spec(project).version:
            out[project] = found
    return out


def adopt_source_versions(
    recipe: Recipe, source_dirs: Mapping[str, Path], accepted: frozenset[str]
) -> tuple[Recipe, tuple[str, ...]]:
    """The recipe whose versions are those of the given trees, for the projects in ``accepted`` (the user's
    explicit ``--accept-source-version``): a wheel is never stamped with a version its source does not
    have. Returns the recipe and the notes the manifest records. A mismatch not accepted is left for
    :func:`~torchkiln.plan.preflight.preflight` to report with everything else."""
    notes: list[str] = []
    for project, found in source_versions(recipe, source_dirs).items():
        if project not in accepted or found.release is None:
            continue
        want = recipe.spec(project).version
        spec = dataclasses.replace(recipe.spec(project), version=found.release)
        if project == "torch":
            recipe = dataclasses.replace(recipe, torch=spec)
        else:
            recipe = dataclasses.replace(recipe, torchvision=spec)
        notes.append(
            f"{ADOPTED.format(project=project)} built the tree's version {found.release} ({found.path} says "
            f"{found.text!r}), not the recipe's {want}"
        )
    return recipe, tuple(notes)


ADOPTED = "--accept-source-version {project}:"  # how adopt_source_versions' note starts


def _adoption(source_dirs: Mapping[str, Path], notes: tuple[str, ...]) -> str:
    """Which versions are the trees' rather than the recipe file's, for the problems they cause: the rules
    then speak of a field whose value the recipe file does not hold (its torchvision.version says 0.28.0,
    the problem is the adopted tree's 0.21.0)."""
    parts = []
    for project, source in source_dirs.items():
        if any(n.startswith(ADOPTED.format(project=project)) for n in notes):
            found = tree_version(project, Path(source))
            parts.append(
                f"{project} {found.release} is the version of the tree {source} (its "
                f"{found.path.name} says {found.text!r}), adopted with --accept-source-version {project} "
                "instead of the recipe file's version"
            )
    return "; ".join(parts)


def adopted_rule_problems(
    recipe: Recipe, source_dirs: Mapping[str, Path], notes: tuple[str, ...]
) -> list[Problem]:
    """The compatibility rules again when a tree's version replaced the recipe's (a torchvision 0.21 tree
    does not pair with torch 2.13 however it is accepted; a torch 2.99 tree is a release without
    compatibility data). Each problem names the adopted tree, not the recipe file, as its source. Run for
    every command right after the adoption (commands.plan.plan_from_args), so neither ``plan`` nor a
    ``build --no-preflight`` goes on with a version the rules refuse: nothing is planned for a release
    torchkiln knows nothing of."""
    where = _adoption(source_dirs, notes)
    if not where:
        return []
    return [dataclasses.replace(p, file=where) for p in check_rules(recipe, recipe.source)]
