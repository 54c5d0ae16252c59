"""Post-build check, run by the plan's ``checks:import`` step with a clean virtualenv's python.

Installs the wheels just built (from their wheelhouse) and, in a fresh interpreter, collects what they say
about how they were built (:mod:`torchkiln.verify.facts`, run as a script). It prints those facts as the
last line of its output; torchkiln then compares them with the recipe using the same code as the
verification suite (:func:`torchkiln.verify.buildconfig.recipe_checks`), so the build and ``torchkiln
verify`` can never disagree about what "matches the recipe" means. A wheel that does not install or import
fails here.

Standard library only: this file runs outside torchkiln's own environment.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

FACTS = Path(__file__).resolve().with_name("verify") / "facts.py"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="install freshly built wheels and report their build facts")
    parser.add_argument("--expect", action="append", default=[], metavar="PROJECT==VERSION")
    parser.add_argument("--wheelhouse", action="append", default=[], metavar="DIR")
    args = parser.parse_args(argv)

    pip = [sys.executable, "-m", "pip", "install", "--quiet"]
    for wheelhouse in args.wheelhouse:
        pip += ["--find-links", wheelhouse]
    result = subprocess.run([*pip, *args.expect], check=False, capture_output=True, text=True)
    if result.returncode != 0:
        print(
            f"postcheck: installing {' '.join(args.expect)} failed:\n{result.stderr[-4000:]}", file=sys.stderr
        )
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
