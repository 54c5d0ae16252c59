"""``torchkiln recipe new RECIPE --python X.Y|INTERPRETER [--output FILE]``: a recipe for this host's Python.

``--python python3`` asks that interpreter its version (``3.13``, or ``3.13t`` for a free-threaded build),
so one command line makes the recipe for whichever Python the host has (README's first build, on Debian 12
and 13 alike). The recipe is written atomically, and only when it passes every check (:mod:`torchkiln.recipe.derive`);
an existing file is left alone unless ``--force``.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from torchkiln.errors import EXIT_OK, UsageError
from torchkiln.files import atomic
from torchkiln.process import runner
from torchkiln.recipe.derive import PYTHON_RE, for_pythons
from torchkiln.recipe.loader import load_recipe, read_limited, resolve_recipe_path

# MAJOR.MINOR, with a "t" for a free-threaded build (PEP 703), as preflight's python check reads it
_VERSION_PROBE = (
    "import sys, sysconfig; "
    "print('%d.%d' % sys.version_info[:2] + ('t' if sysconfig.get_config_var('Py_GIL_DISABLED') else ''))"
)
PROBE_TIMEOUT_S = 20.0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    new = sub.add_parser(
        "new",
        allow_abbrev=False,
        help="make a recipe from another for other Pythons (this host's: --python python3), checked, "
        "with a header saying what it was made from",
    )
    new.add_argument("source", metavar="RECIPE", help="recipe file, or the name of a shipped recipe")
    new.add_argument(
        "--python",
        action="append",
        required=True,
        metavar="X.Y|INTERPRETER",
        help="a Python version (3.13, 3.13t), or an interpreter to ask (python3, /usr/bin/python3); "
        "repeat for several (python.versions)",
    )
    new.add_argument(
        "--output",
        "-o",
        type=Path,
        default=None,
        help="the file to write (default: NAME.toml in the current directory)",
    )
    new.add_argument(
        "--name", default=None, help="recipe.name (default: RECIPE's with its -pyXY part replaced)"
    )
    new.add_argument("--force", action="store_true", help="replace an existing output file")


def python_version(given: str) -> str:
    """``given`` as a Python version: itself when it is one, else what the interpreter it names says."""
    if PYTHON_RE.match(given):
        return given
    found = shutil.which(given)
    if found is None:
        raise UsageError(
            f"--python {given!r}: neither a Python version nor an interpreter on PATH (valid: 3.13, 3.13t, "
            "python3, /usr/bin/python3)"
        )
    try:
        done = runner.run([found, "-c", _VERSION_PROBE], timeout=PROBE_TIMEOUT_S)
    except (runner.ProcessError, OSError) as exc:
        raise UsageError(f"--python {given!r}: {found} does not run ({exc})") from None
    said = done.stdout.strip().splitlines()[-1:] if done.ok else []
    if not said or not PYTHON_RE.match(said[0]):
        reason = done.failure() if not done.ok else f"it printed {done.stdout.strip()[:80]!r}"
        raise UsageError(f"--python {given!r}: cannot read {found}'s version ({reason})")
    return said[0]


def run(args: argparse.Namespace) -> int:
    path = resolve_recipe_path(args.source)
    source = load_recipe(path)
    pythons = [python_version(p) for p in args.python]
    derived = for_pythons(source, read_limited(path).decode("utf-8"), pythons, args.name)
    output = args.output if args.output is not None else Path(f"{derived.recipe.name}.toml")
    if output.exists() and not args.force:
        raise UsageError(f"--output {output}: exists (valid: another file, or --force to replace it)")
    if output.is_dir():
        raise UsageError(f"--output {output}: is a directory (valid: a file name)")
    atomic.write_text(output, derived.text)
    print(
        f"wrote {output}: {derived.recipe.name} ({source.name} for Python {', '.join(pythons)}; torch "
        f"{derived.recipe.torch_wheel_version}, torchvision {derived.recipe.torchvision_wheel_version})"
    )
    return EXIT_OK
