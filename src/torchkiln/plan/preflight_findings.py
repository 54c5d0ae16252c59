"""What every host check of :mod:`torchkiln.plan.preflight` reads and yields: the :class:`Host` (environment,
machine, distribution), each problem as a :class:`Finding` and :class:`PreflightError` carrying them all; and
what the checks of every subject share (the probe runner, the plan's variables, the devel image as a fix).
Apart from the driver, which imports every check: the checks import this module, not the driver.
"""

from __future__ import annotations

import dataclasses
import platform
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from torchkiln.errors import EXIT_USAGE, Problem, TorchkilnError
from torchkiln.host import distro as distros
from torchkiln.host.distro import Distro
from torchkiln.process import runner
from torchkiln.recipe.image_bases import devel_problem

from .model import Plan

PROBE_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Finding:
    """One problem of the host: what was checked, what was found, what the recipe wants, how to fix it."""

    check: str
    found: str
    wanted: str
    fix: str

    def __str__(self) -> str:
        return f"host: {self.check}: found {self.found}; needs {self.wanted} (fix: {self.fix})"


class PreflightError(TorchkilnError):
    """The host cannot build the plan: every reason, one line each (exit status 2)."""

    exit_code = EXIT_USAGE

    def __init__(self, findings: list[Finding], problems: list[Problem] | None = None) -> None:
        self.findings = list(findings)
        self.problems = list(problems or [])
        lines = [str(p) for p in self.problems] + [str(f) for f in self.findings]
        count = len(lines)
        lines.append(f"preflight: {count} problem(s); nothing was fetched or built")
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class Host:
    """What the checks read: the caller's environment (PATH, CC), the machine (``uname -m``), the distribution
    (/etc/os-release: what the fix hints may say it packages, torchkiln.host.distro) and the file system,
    nothing else."""

    environ: Mapping[str, str]
    machine: str = dataclasses.field(default_factory=platform.machine)
    distro: Distro = dataclasses.field(default_factory=distros.this_host)


HostCheck = Callable[[Plan, Host], Iterator[Finding]]


def _env(plan: Plan) -> dict[str, str]:
    """The variables torchkiln sets for the first project's compile (CUDA_HOME, MAGMA_HOME, ...)."""
    return plan.env_for(plan.projects[0])


def _run(argv: list[str], host: Host) -> runner.Completed | str:
    """The completed probe, or a one-line reason it could not run."""
    try:
        return runner.run(argv, env=dict(host.environ), timeout=PROBE_TIMEOUT_S)
    except (runner.ProcessError, OSError) as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _devel_image(plan: Plan, has: str) -> str:
    """``; or build in the devel image, which has {has}: ...`` where ``torchkiln images`` makes a devel image
    that builds the recipe (recipe.image_bases.devel_problem: its one Python and its gcc are a base's, its
    platform and BLAS have images, ...), else nothing: an offer the images command would refuse is no fix."""
    if devel_problem(plan.recipe) is not None:
        return ""
    return f"; or build in the devel image, which has {has}: torchkiln images --recipe {plan.recipe.name} --target devel"
