"""The command line every wheel-rewriting module shares (``python -m torchkiln.artifacts.bundle``, ``.cudalibs``,
``.repair``, which the plan's package steps run): wheels or directories of them, ``--out``, the module's own
options; each wheel rewritten in turn, its summary printed; an error a user can act on ends it with its exit
code, never a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from torchkiln.errors import EXIT_OK, TorchkilnError, UsageError

from . import wheelfile


def given_wheels(given: Iterable[Path]) -> list[Path]:
    """The wheels of the command line: each file given, and the wheels of each directory given."""
    wheels: list[Path] = []
    for path in given:
        if path.is_dir():
            found = wheelfile.find([path])
            if not found:
                raise UsageError(f"{path}: no wheels in this directory")
            wheels += found
        elif path.is_file():
            wheels.append(path)
        else:
            raise UsageError(f"{path}: no such wheel")
    return wheels


Options = Callable[[argparse.ArgumentParser], None]
Rewrite = Callable[[Path, argparse.Namespace], list[str]]


def command(
    module: str, doc: str | None, out_help: str, options: Options, rewrite: Rewrite
) -> Callable[..., int]:
    """The ``main`` of ``python -m torchkiln.artifacts.MODULE WHEEL... --out DIR [options]``: ``rewrite`` each
    wheel, printing the lines it returns."""

    def main(argv: list[str] | None = None) -> int:
        return run(argv, module, (doc or "").splitlines()[0], out_help, options, rewrite)

    return main


def run(
    argv: list[str] | None, module: str, description: str, out_help: str, options: Options, rewrite: Rewrite
) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog=f"python -m torchkiln.artifacts.{module}", description=description
    )
    parser.add_argument(
        "wheels", nargs="+", type=Path, metavar="WHEEL", help="wheels, or directories of wheels"
    )
    parser.add_argument("--out", type=Path, required=True, help=out_help)
    options(parser)
    args = parser.parse_args(argv)
    try:
        for wheel in given_wheels(args.wheels):
            print("\n".join(rewrite(wheel, args)), flush=True)
    except TorchkilnError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return EXIT_OK
