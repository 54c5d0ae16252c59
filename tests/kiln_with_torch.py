"""``torchkiln`` with one step added to its plans: torch 2.13.0 pip-installed into the build venv after the
build requirements.

The test extension (tests/data/ext_project) stands in for torch's source tree, but unlike it, it builds
against an installed torch. The build venv gets that torch through a step of the plan (recorded, kept in
the environment store and checked like every env step), never by hand: a venv the build did not make is
removed, never built in (issue 27). Run as ``python tests/kiln_with_torch.py build ...`` it is the CLI with
that step (the tests that signal a running build); :func:`with_torch` adds it to a plan in-process.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from torchkiln.plan.model import Plan, Step

TORCH = "torch==2.13.0"  # the local CPU wheel on this machine's index (2.13.0+cpu)


def with_torch(plan: Plan) -> Plan:
    """``plan`` with ``build-env:torch`` right after ``build-env:deps`` (on the same venv, held to its pins)."""
    names = [s.name for s in plan.steps]
    if "build-env:torch" in names:
        return plan
    at = names.index("build-env:deps") + 1
    python, constraints = str(plan.paths.venv_python), str(plan.paths.constraints)
    step = Step(
        "build-env:torch",
        "env",
        "",
        (python, "-m", "pip", "install", "--quiet", "--constraint", constraints, "--", TORCH),
        venv=str(plan.paths.venv),
    )
    return replace(plan, steps=[*plan.steps[:at], step, *plan.steps[at:]])


def main(argv: list[str]) -> int:
    from torchkiln import cli
    from torchkiln.commands import build

    planned = build.plan_from_args
    build.plan_from_args = lambda args, command="plan": with_torch(planned(args, command))
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
