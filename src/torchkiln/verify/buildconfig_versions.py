"""Build-config checks of versions and commits: torch's version and local label, the commit it was built
from (:func:`_pinned_commit`, torchvision's too) and the Python it runs on, each against the recipe."""

from __future__ import annotations

from packaging.version import Version

from torchkiln.recipe.model import Recipe

from .comparison import Comparison, _cmp, _skip
from .facts import BuildFacts


def _torch_version_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Comparison:
    return _cmp(
        "torch_version",
        "torch version (torch.__version__ without local label)",
        Version(recipe.torch_wheel_version).public,
        Version(facts.torch_version).public,
        field="torch.version",
    )


def _local_label_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Comparison:
    actual = Version(facts.torch_version)
    wanted = Version(recipe.torch_wheel_version)
    return _cmp(
        "local_label",
        "torch local version label",
        f"+{wanted.local}" if wanted.local else "(none)",
        f"+{actual.local}" if actual.local else "(none)",
        field="build.pytorch_build_version" if recipe.build.pytorch_build_version else "build.local_version",
    )


def _commit_vs_recipe(recipe: Recipe, facts: BuildFacts, commit: str | None) -> Comparison:
    if recipe.torch.commit or commit:
        return _pinned_commit("git_commit", "torch", recipe.torch.commit, commit, facts.git_version)
    return _cmp(
        "git_commit",
        "torch.version.git_version",
        "a commit, not 'Unknown'",
        facts.git_version,
        ok=facts.git_version not in (None, "", "Unknown"),
        field="torch.commit",
    )


def _python_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Comparison:
    """The interpreter against the recipe's Python, or any of its python.versions (a free-threaded "3.13t"
    runs as 3.13: facts.python_version is MAJOR.MINOR)."""
    field = "python.versions" if len(recipe.python_versions) > 1 else "python.version"
    if not facts.python_version:
        return _skip("python", "the Python version was not collected", field=field)
    wanted = " or ".join(recipe.python_versions)
    ok = facts.python_version in {p.removesuffix("t") for p in recipe.python_versions}
    return _cmp("python", "Python version running the build", wanted, facts.python_version, ok, field=field)


def _pinned_commit(
    check_id: str, project: str, pinned: str | None, built_from: str | None, actual: str | None
) -> Comparison:
    """``<project>.commit`` (or, where the recipe pins none, the commit the build's checkout was at) against
    the commit the build reports (``<project>.version.git_version``)."""
    source = "the recipe's pinned commit" if pinned else "the commit it was built from"
    what = f"{project}.version.git_version vs {source}"
    return _cmp(check_id, what, pinned or built_from, actual, field=f"{project}.commit")
