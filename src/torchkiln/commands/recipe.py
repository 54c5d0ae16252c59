"""``torchkiln recipe check FILE...``, ``torchkiln recipe list`` and ``torchkiln recipe describe``
and ``torchkiln recipe new RECIPE --python X.Y``."""

from __future__ import annotations

import argparse
import sys

from torchkiln.errors import EXIT_OK, EXIT_USAGE, RecipeError
from torchkiln.printing import LiteralTable, make_console, show, text
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
    desc = sub.add_parser(
        "describe",
        allow_abbrev=False,
        help="write the exact recipe of the torch + torchvision installed in a Python (torchkiln verify "
        "--recipe passes on it)",
    )
    desc.add_argument(
        "--python",
        default=sys.executable,
        metavar="PYTHON",
        help="the interpreter whose installed torch is described (default: this one)",
    )
    desc.add_argument("--name", help="recipe.name (default: torch-<version>-<label>-py<XY>)")
    desc.add_argument("--description", help="recipe.description (default: the versions described)")
    desc.add_argument(
        "--output",
        "--out",
        dest="out",
        metavar="FILE",
        help="write the recipe here (default: standard output)",
    )
    recipe_new.register(sub)


def run(args: argparse.Namespace) -> int:
    if args.recipe_command == "check":
        return check(args.files)
    if args.recipe_command == "describe":
        return describe(args.python, name=args.name, description=args.description, out=args.out)
    if args.recipe_command == "new":
        return recipe_new.run(args)
    return list_recipes(args.dir)


def describe(python: str, *, name: str | None, description: str | None, out: str | None) -> int:
    """Run the facts script (:mod:`torchkiln.verify.facts`, standard library only) in ``python``, write the
    recipe they satisfy (:func:`torchkiln.commands.describe.describe`) after loading it as ``verify`` will."""
    import json
    from pathlib import Path

    from torchkiln.commands import describe as describing
    from torchkiln.errors import UsageError
    from torchkiln.files import atomic
    from torchkiln.process import runner
    from torchkiln.recipe.loader import parse_recipe
    from torchkiln.verify import facts

    # cwd=/: torch is imported from the interpreter's site-packages, never from a source tree in the cwd.
    try:
        result = runner.run([python, facts.__file__], cwd="/", timeout=600)
    except OSError as exc:
        raise UsageError(f"--python {python}: cannot run it ({exc.strerror or exc})") from None
    if not result.ok:
        raise UsageError(f"--python {python}: importing its torch failed: {result.failure()}")
    found = describing.facts_from_output(result.stdout, python)
    path = runner.run([python, "-c", "import json, sys; print(json.dumps(sys.path))"], cwd="/", timeout=60)
    if not path.ok:
        raise UsageError(f"--python {python}: its sys.path could not be read: {path.failure()}")
    needs = describing.unresolved_needs(json.loads(path.stdout.strip().splitlines()[-1]))
    text = describing.describe(
        found, name=name or describing.default_name(found), description=description, needs=needs
    )
    try:
        parse_recipe(text.encode(), out or "<described recipe>")
    except RecipeError as exc:  # a build this recipe format cannot say: name what, write nothing
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EXIT_USAGE
    if out:
        atomic.write_text(Path(out), text)
        print(
            f"{out}: {found.torch_version} / {found.torchvision.version if found.torchvision else None}",
            file=sys.stderr,
        )
    else:
        sys.stdout.write(text)
    return EXIT_OK


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
    table = LiteralTable(*columns, title=f"recipes in {root}")
    invalid = 0
    for file in files:
        try:
            r = load_recipe(file)
        except RecipeError as exc:
            invalid += 1
            table.add_row(
                file.stem,
                "",
                text(("invalid", "red")),
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
    show(make_console(width=200), table)
    return EXIT_USAGE if invalid else EXIT_OK
