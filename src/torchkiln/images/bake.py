"""``docker-bake.json``: every shipped recipe's devel, wheels and runtime images as one bake file.

``docker buildx bake`` reads JSON natively, so the file is data serialised with :mod:`json`, never text
assembled by hand. Bake reads JSON with HCL's JSON syntax, in which every string is a template: ``${NAME}``
interpolates a variable (the tags use ``${REGISTRY}``, so ``REGISTRY=ghcr.io/you docker buildx bake --push``
publishes them) and ``%{`` starts a directive. A literal ``${`` or ``%{`` from a recipe is written ``$${`` /
``%%{`` (:func:`literal`), so no recipe value can become an expression.

The build args and labels are :mod:`torchkiln.images.spec`' (the same ``torchkiln images`` passes); a runtime
target's ``dist`` context is its recipe's ``wheels`` target, so its versions come from the recipe (no build
has happened when the file is generated): the image's sanity gate compares them with the manifest that
the ``wheels`` stage exports beside the wheels.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from torchkiln.distributed.spec import DEFAULT_TOKEN_ENV
from torchkiln.errors import Problem, RecipeError
from torchkiln.recipe.compat import image_problem
from torchkiln.recipe.model import Recipe

from .platforms import image_platform
from .spec import (
    CACHE_SECRET_ID,
    CLUSTER_SECRET_ID,
    DEFAULT_REGISTRY,
    DOCKERFILES,
    FLAVOURS,
    devel_args,
    image_labels,
    image_tag,
    runtime_args,
)

BAKE_FILE = "docker-bake.json"
# The variable whose value replaces the registry part of every tag.
REGISTRY_VARIABLE = "REGISTRY"
# Groups beside one per flavour: what a plain `docker buildx bake` builds.
DEFAULT_GROUP = ("devel", "runtime")


def literal(value: str) -> str:
    """``value`` as a bake string that means exactly itself (no interpolation, no directive)."""
    return value.replace("${", "$${").replace("%{", "%%{")


def target_name(recipe: Recipe, flavour: str) -> str:
    """Bake target names allow letters, digits, '-' and '_': the recipe name with dots made '_'."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", recipe.name) + f"-{flavour}"


def _tag(recipe: Recipe, flavour: str) -> str:
    """The image's tag with its registry part replaced by the registry variable."""
    repository = image_tag(recipe, flavour).split("/", 1)[1]
    return f"${{{REGISTRY_VARIABLE}}}/{literal(repository)}"


def _literals(values: dict[str, str]) -> dict[str, str]:
    return {key: literal(value) for key, value in values.items()}


def _target(recipe: Recipe, flavour: str, recipes_root: str) -> dict[str, Any]:
    contexts = {"recipe": recipes_root}
    if flavour == "runtime":
        contexts = {"dist": f"target:{target_name(recipe, 'wheels')}", **contexts}
        args = runtime_args(recipe)
    else:
        args = devel_args(recipe)
    target: dict[str, Any] = {
        "dockerfile": DOCKERFILES[flavour],
        "context": ".",
        "target": flavour,
        "platforms": [image_platform(recipe).oci],
        "contexts": _literals(contexts),
        "args": _literals(args),
    }
    if flavour == "wheels":
        target["secret"] = [f"id={CACHE_SECRET_ID},env=TORCHKILN_CACHE_PASSWORD"]
        if recipe.cluster is not None:  # its credentials_file is the secret's mount (torchkiln images checks)
            target["secret"].append(f"id={CLUSTER_SECRET_ID},env={DEFAULT_TOKEN_ENV}")
        target["output"] = ["type=local,dest=dist"]
    else:
        target["tags"] = [_tag(recipe, flavour)]
    target["labels"] = _literals(image_labels(recipe, flavour))
    return target


def left_out(recipe: Recipe) -> str | None:
    """Why ``recipe`` gets no targets (None: it gets all three): the first flavour torchkiln makes no image of
    for it (recipe.compat.image_problem)."""
    return next(filter(None, (image_problem(recipe, flavour) for flavour in FLAVOURS)), None)


def bake_document(recipes: Iterable[Recipe], *, recipes_root: str = "recipes") -> dict[str, Any]:
    """The bake file as data: a devel, a wheels and a runtime target per recipe, a group per flavour.

    Tags must be unique: two recipes that would share one (same torch version and accelerator) are an
    error naming both files. Each target builds for its recipe's platform (``platforms``: linux/amd64 or
    linux/arm64). A recipe some flavour cannot be made for (recipe.compat.image_problem: an NVPL recipe has no
    wheels stage for its runtime image to take the wheels from) gets no targets.
    """
    ordered = sorted((r for r in recipes if left_out(r) is None), key=lambda r: r.name)
    seen: dict[str, Recipe] = {}
    for recipe in ordered:
        tag = image_tag(recipe, "devel")
        if tag in seen:
            other = seen[tag]
            raise RecipeError(
                [
                    Problem(
                        recipe.source,
                        "recipe.name",
                        f"image tag {tag.split(':', 1)[1]} is also {other.source}'s",
                        "one recipe per torch version and accelerator in a bake file",
                    )
                ]
            )
        seen[tag] = recipe
    groups = {flavour: [target_name(r, flavour) for r in ordered] for flavour in FLAVOURS}
    return {
        "variable": {REGISTRY_VARIABLE: {"default": DEFAULT_REGISTRY}},
        "group": {
            "default": {"targets": [name for flavour in DEFAULT_GROUP for name in groups[flavour]]},
            **{flavour: {"targets": names} for flavour, names in groups.items()},
        },
        "target": {
            target_name(recipe, flavour): _target(recipe, flavour, recipes_root)
            for recipe in ordered
            for flavour in FLAVOURS
        },
    }


def bake_text(recipes: Iterable[Recipe], *, recipes_root: str = "recipes") -> str:
    """``docker-bake.json``'s text: :func:`bake_document`, indented, keys in the order built, final newline."""
    return json.dumps(bake_document(recipes, recipes_root=recipes_root), indent=2) + "\n"
