"""``torchkiln recipe check FILE...``, ``torchkiln recipe list`` and ``torchkiln recipe new RECIPE --python X.Y``."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.table import Table

from torchkiln.errors import EXIT_OK, EXIT_USAGE, RecipeError
from torchkiln.recipe.loader import load_recipe, recipes_dir, resolve_recipe_path
from torchkiln.recipe.model import Recipe

from . import recipe_new


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="recipe_command", metavar="ACTION", required=True)
    check = sub.add_parser(
        "check",
        allow_abbrev=False,
        help="validate recipes: exit 0 when all are valid, else 2 with one line per problem",
    )
    check.add_argument("files", nargs="+", metavar="RECIPE", help="recipe files, or names of shipped recipes")
    lst = sub.add_parser("list", allow_abbrev=False, help="show the shipped recipes as a table")
    lst.add_argument("--dir", default=None, help="directory of recipes (default: the shipped recipes/)")
    recipe_new.register(sub)


def run(args: argparse.Namespace) -> int:
    if args.recipe_command == "check":
        return check(args.files)
    if args.recipe_command == "new":
        return recipe_new.run(args)
    return list_recipes(args.dir)


def check(files: list[str]) -> int:
    failed = False
    for file in files:
        try:
            recipe = load_recipe(resolve_recipe_path(file))
        except RecipeError as exc:
            failed = True
            for problem in exc.problems:
                print(problem, file=sys.stderr)
            continue
        print(
            f"{file}: ok ({recipe.name}: torch {recipe.torch_wheel_version}, "
            f"torchvision {recipe.torchvision_wheel_version})"
        )
    return EXIT_USAGE if failed else EXIT_OK


def _accelerator(recipe: Recipe) -> str:
    acc = recipe.accelerator
    if not acc.is_cuda:
        return "cpu"
    return f"CUDA {acc.cuda}, cuDNN {acc.cudnn}, NCCL {acc.nccl}"


def list_recipes(directory: str | None) -> int:
    from pathlib import Path

    root = Path(directory) if directory else recipes_dir()
    files = sorted(root.glob("*.toml"))
    if not files:
        print(f"{root}: no recipes (*.toml)", file=sys.stderr)
        return EXIT_USAGE
    table = Table(title=f"recipes in {root}")
    columns = (
        "recipe",
        "platform",
        "torch",
        "torchvision",
        "python",
        "accelerator",
        "arch list",
        "blas",
        "magma",
    )
    for column in columns:
        table.add_column(column)
    invalid = 0
    for file in files:
        try:
            r = load_recipe(file)
        except RecipeError as exc:
            invalid += 1
            table.add_row(
                file.stem,
                "",
                "[red]invalid[/red]",
                str(len(exc.problems)) + " problem(s)",
                "",
                "",
                "",
                "",
                "",
            )
            continue
        table.add_row(
            r.name,
            r.build.platform,
            r.torch_wheel_version,
            r.torchvision_wheel_version,
            ", ".join(r.python_versions),
            _accelerator(r),
            r.accelerator.arch_list_env or "-",
            f"{r.blas.kind} {r.blas.mkl or ''}".strip(),
            str(r.magma.version) if r.magma else "-",
        )
    Console(width=200).print(table)
    return EXIT_USAGE if invalid else EXIT_OK
