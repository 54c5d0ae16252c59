"""Post-build check, run by the plan's ``checks:import`` step with a clean virtualenv's python.

Installs the wheels just built (by path, from their wheelhouse) and, in a fresh interpreter, collects what they say
about how they were built (:mod:`torchkiln.verify.facts`, run as a script). It prints those facts as the
last line of its output; torchkiln then compares them with the recipe using the same code as the
verification suite (:func:`torchkiln.verify.buildconfig.recipe_checks`), so the build and ``torchkiln
verify`` can never disagree about what "matches the recipe" means. A wheel that does not install or import
fails here.

Standard library only: this file runs outside torchkiln's own environment, in a clean venv where torchkiln
is not installed. So it runs its two commands with :mod:`subprocess` itself rather than through
:mod:`torchkiln.process.runner`, and finds the wheels with :mod:`torchkiln.artifacts.wheelfile` loaded by path (a
standard-library-only module without relative imports).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
FACTS = HERE.parent / "verify" / "facts.py"


def _wheelfile() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "_torchkiln_wheelfile", HERE.parent / "artifacts" / "wheelfile.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def built_wheel(project: str, version: str, wheelhouses: list[str]) -> Path | None:
    """The wheel of ``project`` at exactly ``version`` that the build wrote (never one from an index: a
    local label such as +cpu can also exist upstream, and the check must test what was built)."""
    found: list[Path] = _wheelfile().find([Path(d) for d in wheelhouses], project=project, version=version)
    return found[0] if found else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description="install freshly built wheels and report their build facts"
    )
    parser.add_argument("--expect", action="append", default=[], metavar="PROJECT==VERSION")
    parser.add_argument("--wheelhouse", action="append", default=[], metavar="DIR")
    parser.add_argument(
        "--with",
        dest="also",
        action="append",
        default=[],
        metavar="WHEEL_OR_REQ",
        help="installed with the built wheels (the torch given with --torch)",
    )
    parser.add_argument(
        "--constraints",
        default=None,
        metavar="FILE",
        help="the build env's pins (build-env:deps), kept by this install when the file exists",
    )
    args = parser.parse_args(argv)

    wheels = []
    for item in args.expect:
        project, _, version = item.partition("==")
        wheel = built_wheel(project, version, args.wheelhouse)
        if wheel is None:
            found = sorted(p.name for d in args.wheelhouse for p in Path(d).glob("*.whl"))
            print(
                f"postcheck: the build wrote no {project} {version} wheel (found: {', '.join(found) or 'none'})",
                file=sys.stderr,
            )
            return 1
        wheels.append(str(wheel))
    constraint = (
        ["--constraint", args.constraints] if args.constraints and Path(args.constraints).is_file() else []
    )
    # The built wheels by path; their dependencies (and nothing of theirs) from the configured index.
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", *constraint, "--", *wheels, *args.also],
        check=False,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        print(f"postcheck: installing {' '.join(wheels)} failed:\n{result.stderr[-4000:]}", file=sys.stderr)
        return 1
    # cwd=/: the wheels are imported from site-packages, never from a source tree next to the cwd.
    probe = subprocess.run(
        [sys.executable, str(FACTS)], check=False, capture_output=True, text=True, cwd="/", timeout=600
    )
    if probe.returncode != 0:
        print(f"postcheck: importing the wheels failed:\n{probe.stderr[-4000:]}", file=sys.stderr)
        return 1
    facts = json.loads(probe.stdout.strip().splitlines()[-1])
    print(json.dumps(facts, sort_keys=True))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
