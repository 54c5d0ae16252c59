"""``torchkiln recipe new RECIPE --python X.Y|INTERPRETER [--output FILE]``: a recipe for this host's Python.

``--python`` takes a version (``3.14``, ``3.14t`` for a free-threaded build), an interpreter's name that says
one (``python3.14``, ``python3.14t``: the version it names, installed or not, so the recipe can be made before
the Python is there), or an interpreter to ask (``python3`` on PATH, or a path such as
``/usr/bin/python3.14``): ``--python python3`` makes the recipe for whichever Python the host has (README's
first build, on Debian 12 and 13 alike). A form it refuses is answered with the forms, the versions taken from
what the recipe's torch release supports (data/compat.toml). The recipe is written atomically, and only when it passes every check (:mod:`torchkiln.recipe.derive`);
an existing file is left alone unless ``--force``.
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

from torchkiln.errors import EXIT_OK, UsageError
from torchkiln.files import atomic
from torchkiln.process import runner
from torchkiln.recipe.compat import minor, supported_pythons, torch_release
from torchkiln.recipe.derive import PYTHON_RE, for_pythons
from torchkiln.recipe.loader import load_recipe, read_limited, resolve_recipe_path
from torchkiln.recipe.model import Recipe

# MAJOR.MINOR, with a "t" for a free-threaded build (PEP 703), as preflight's python check reads it
_VERSION_PROBE = (
    "import sys, sysconfig; "
    "print('%d.%d' % sys.version_info[:2] + ('t' if sysconfig.get_config_var('Py_GIL_DISABLED') else ''))"
)
PROBE_TIMEOUT_S = 20.0
# An interpreter's name that says its version: CPython installs pythonX.Y, and pythonX.Yt for a free-threaded
# build (PEP 703).
NAMED = re.compile(r"^python(3\.\d{1,2}t?)$")


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
        metavar="X.Y|pythonX.Y|INTERPRETER",
        help="a Python version (3.14, 3.14t), an interpreter's name that says one (python3.14), or an "
        "interpreter to ask (python3, /usr/bin/python3.14); repeat for several (python.versions)",
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


def forms(source: Recipe) -> str:
    """What ``--python`` takes, with the versions the recipe's torch release supports (data/compat.toml)."""
    release = torch_release(source)
    pythons = supported_pythons(release) if release is not None else []
    example = next((p for p in reversed(pythons) if not p.endswith("t")), "3.13")
    versions = f"{', '.join(pythons)}: torch {minor(source.torch.version)}'s" if pythons else "such as 3.13"
    return (
        f"a Python version ({versions}), its interpreter's name (python{example}), an interpreter on PATH to "
        f"ask (python3), or an interpreter's path (/usr/bin/python{example})"
    )


def python_version(given: str, source: Recipe) -> str:
    """``given`` as a Python version: itself when it is one, the version an interpreter's name ``pythonX.Y``
    says, else what the interpreter it names (on PATH, or a path) says it is."""
    if PYTHON_RE.match(given):
        return given
    if named := NAMED.match(given):
        return named.group(1)
    if "/" in given:
        found: str | None = given if Path(given).is_file() else None
        if found is None:
            raise UsageError(f"--python {given!r}: no such file (valid: {forms(source)})")
    else:
        found = shutil.which(given)
        if found is None:
            raise UsageError(
                f"--python {given!r}: neither a Python version nor an interpreter on PATH (valid: {forms(source)})"
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
    pythons = [python_version(p, source) for p in args.python]
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
