"""The test extension's recipe as its builds use it: tests/data/ext-cpu-test.toml with torch among the build
venv's requirements.

The test extension (tests/data/ext_project) stands in for torch's source tree, but unlike it, it builds
against an installed torch. The recipe asks for it as the product lets any recipe ask for what a tree builds
against and does not declare: ``build.requirements`` (docs/build.md), resolved with the tree's own
requirements in ``build-env:deps``, pinned in constraints.txt, kept in the environment store and checked like
every env step's result. So these builds are plans the product makes from a recipe, nothing added to them
(issue 48); a venv made by hand would be removed, never built in (issue 27).
"""

from __future__ import annotations

from kit import ROOT

TORCH = "torch==2.13.0"  # the local CPU wheel on this machine's index (2.13.0+cpu)
RECIPE = ROOT / "tests" / "data" / "ext-cpu-test.toml"


def ext_recipe_text(extra: str = "") -> str:
    """The test recipe's text with ``build.requirements = [TORCH]``, and ``extra`` TOML appended."""
    text = RECIPE.read_text()
    if "\n[build]\n" not in text:
        raise ValueError(f"{RECIPE}: no [build] table to add build.requirements to")
    return text.replace("\n[build]\n", f'\n[build]\nrequirements = ["{TORCH}"]\n', 1) + extra
