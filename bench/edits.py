"""The edit loop of bench/rebuild.py (issue 47 item 2): a tree rebuilt where it was built, after an edit.

Each edit is made to two trees built once before: torchkiln's (builder E: its work directory, its in-tree
``build/``) and by hand's (``python -m build --wheel --no-isolation`` in the tree, in place, warm). Then each
is rebuilt where it was built, timed, and the ratio is torchkiln over by hand (goal: 1.2 at most). The edits:

* ``code``: a code change in one .cpp (a function added: the extension's bytes change), one unit recompiled;
* ``header``: a header that many units include changed (vision_like's csrc/kiln_macros.h: 42 of 44 units;
  torchvision's csrc/macros.h, included by its ops headers);
* ``flag``: a recipe flag the tree's build reads: ``[build] type = "Debug"`` sets ``DEBUG=1``, which
  torchvision's setup.py (and vision_like's) turns into ``-g -O0`` for every unit; by hand ``DEBUG=1``.

The edits accumulate (the header edit keeps the code edit, the flag edit both), as a developer's do. Each
torchkiln row says its wheel's sha256 and whether it equals a fresh torchkiln build of the same source state:
the edited tree copied to the same path (the path is in the wheel's bytes; the copy keeps the files' times,
from which a tree without git takes SOURCE_DATE_EPOCH) and built from an empty work directory with the same
(warm) cache; the rebuilt tree is put back afterwards for the next edit.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

# the files each tree's edits touch: (one unit, a header many units include)
EDITED = {
    "vision_like": ("csrc/ops/op_00.cpp", "csrc/kiln_macros.h"),
    "torchvision-0.21": ("torchvision/csrc/ops/cpu/nms_kernel.cpp", "torchvision/csrc/macros.h"),
}
DEBUG_RECIPE = (
    'local_version = "+cpu"\ntype = "Debug"'  # [build] of tests/data/ext-cpu-test.toml, plus the type
)


@dataclass(frozen=True)
class Edit:
    name: str
    what: str
    apply: Callable[[Path], None]  # the edit, made in a tree
    debug: bool = False  # the recipe's [build] type = "Debug"; by hand DEBUG=1


def _append(relative: str, text: str) -> Callable[[Path], None]:
    def apply(tree: Path) -> None:
        path = tree / relative
        path.write_text(path.read_text() + text)

    return apply


def edits(tree_name: str) -> list[Edit]:
    unit, header = EDITED[tree_name]
    return [
        Edit(
            "code",
            f"a code change in one .cpp ({unit})",
            _append(unit, "\nint kiln_edited() { return 47; }\n"),
        ),
        Edit(
            "header",
            f"a header many units include ({header})",
            _append(header, "\ninline int kiln_header_edited() { return 47; }\n"),
        ),
        Edit("flag", 'a recipe flag: build.type = "Debug" (by hand DEBUG=1)', lambda tree: None, debug=True),
    ]


def debug_recipe(recipe: Path) -> Path:
    """``recipe`` with ``[build] type = "Debug"``, beside it."""
    text = recipe.read_text()
    if 'local_version = "+cpu"' not in text:
        raise SystemExit(f"bench: {recipe} has no [build] local_version to put the build type beside")
    out = recipe.with_name(recipe.stem + "-debug.toml")
    out.write_text(text.replace('local_version = "+cpu"', DEBUG_RECIPE, 1))
    return out


def fresh_of(builder: Path, build: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A build of ``builder``'s tree as it is now, at the same path, from an empty work directory: the tree,
    work directory and dist/ are set aside, the tree's sources copied back (no ``build/``), built by
    ``build()`` (a build of ``builder``), and everything put back as it was."""
    parts = ("vision", "work", "dist")
    for part in parts:
        if (builder / part).exists():
            (builder / part).rename(builder / f"{part}.kept")
    try:
        shutil.copytree(
            builder / "vision.kept",
            builder / "vision",
            symlinks=True,
            ignore=shutil.ignore_patterns("build", "*.egg-info", "version.py"),  # what a build writes
        )
        return build()
    finally:
        for part in parts:
            shutil.rmtree(builder / part, ignore_errors=True)
            if (builder / f"{part}.kept").exists():
                (builder / f"{part}.kept").rename(builder / part)


def edit_rows(
    tree_name: str,
    kiln_build: Callable[[str, Path, Path | None], dict[str, Any]],
    hand_build: Callable[[str, Path, dict[str, str]], dict[str, Any]],
    kiln_builder: Path,
    hand_tree: Path,
    recipe: Path,
    only: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """The edit rows, each torchkiln row beside by hand's for the same edit. ``kiln_build(name, builder,
    recipe)`` builds ``builder``'s tree in place (``recipe`` None: the usual one); ``hand_build(name, tree,
    extra_env)`` builds ``tree`` by hand in place. Both trees were built once before. ``only``: these edits."""
    rows: list[dict[str, Any]] = []
    debug = None
    hand_env: dict[str, str] = {}
    for edit in edits(tree_name):
        if only and edit.name not in only:
            continue
        if edit.debug:
            debug = debug_recipe(recipe)
            hand_env = {"DEBUG": "1"}
        edit.apply(hand_tree)
        hand = hand_build(f"by hand in place: {edit.what}", hand_tree, hand_env)
        edit.apply(kiln_builder / "vision")
        kiln = kiln_build(f"torchkiln in place: {edit.what}", kiln_builder, debug)
        fresh = fresh_of(
            kiln_builder, partial(kiln_build, f"  fresh build ({edit.name})", kiln_builder, debug)
        )
        kiln["edit"] = hand["edit"] = edit.name
        kiln["fresh_wheel_sha256"] = fresh.get("wheel_sha256")
        kiln["same_wheel_as_fresh"] = fresh.get("wheel_sha256") == kiln.get("wheel_sha256")
        kiln["ratio_to_by_hand"] = round(kiln["seconds"] / hand["seconds"], 2) if hand["seconds"] else None
        rows += [hand, kiln]
    return rows
