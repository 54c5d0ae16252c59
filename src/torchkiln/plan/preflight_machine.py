"""Preflight's checks of the machine itself: its architecture is the recipe's platform, and it has the free
disk and the memory the build needs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from torchkiln.recipe.compat import compat, platform_data

from .jobs import GIB, PER_JOB_GIB, RESERVE_GIB
from .model import Plan
from .preflight_findings import Finding, Host

# Free disk a build needs under its work directory, by accelerator kind (GiB). Estimates, not measured on
# this host (no full torch build was run here): a torch checkout with its submodules at depth 1 (about
# 2 GiB), its CMake build tree (CPU: about 10 GiB; CUDA with six arch targets: several times that, the
# fatbins of every kernel per arch), the wheels twice (wheelhouse, then dist/) and the two venvs.
# Conservative on purpose: running out at link time costs the whole compile.
DISK_GIB: dict[str, float] = {"cpu": 20.0, "cuda": 60.0}
# torchvision alone (--only torchvision): two venvs with torch (the build's and the check's), the tree and
# its build/, the wheel. Measured: a venv of upstream's torch 2.6.0+cu124 with its NVIDIA wheels is 5.3 GiB
# (du -sh), one of torch 2.13.0+cpu 1.2 GiB; the venvs kept by the environment store are hard links.
DISK_GIB_VISION: dict[str, float] = {"cpu": 5.0, "cuda": 15.0}


def _platform(plan: Plan, host: Host) -> Iterator[Finding]:
    """torchkiln does not cross-compile: an aarch64 recipe builds on an aarch64 machine (a GH200, or an arm64
    root or image run under emulation), an x86_64 recipe on an x86_64 one."""
    wanted = plan.recipe.build.platform
    if host.machine in platform_data(plan.recipe)["machines"]:
        return
    native = next((p for p, d in compat()["platform"].items() if host.machine in d["machines"]), None)
    yield Finding(
        "platform",
        f"this machine is {host.machine}",
        f"an {wanted} machine (build.platform = {wanted!r}; torchkiln does not cross-compile)",
        f"build on an {wanted} machine (an {wanted} root under qemu-user is one too, but far too slow for "
        f"torch's compile: docs/aarch64.md)" + (f"; or use a recipe for {native}" if native else ""),
    )


def _existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def _disk(plan: Plan, host: Host) -> Iterator[Finding]:
    table = DISK_GIB if "torch" in plan.projects else DISK_GIB_VISION
    need = table[plan.recipe.accelerator.kind]
    where = _existing(plan.paths.workdir)
    try:
        stats = os.statvfs(where)
    except OSError as exc:
        yield Finding(
            "disk", f"cannot read free space of {where}: {exc.strerror}", f"{need:g} GiB", "check it"
        )
        return
    free = stats.f_bavail * stats.f_frsize / GIB
    if free < need:
        yield Finding(
            "disk",
            f"{free:.1f} GiB free under {where}",
            f"{need:g} GiB for a {plan.recipe.accelerator.kind} build of {', '.join(plan.projects)} (checkout, "
            "build tree, venvs, wheels; torchkiln.plan.preflight_machine.DISK_GIB, DISK_GIB_VISION)",
            "free space, or use --workdir on a larger disk",
        )


def _memory(plan: Plan, host: Host) -> Iterator[Finding]:
    kind = plan.recipe.accelerator.kind
    per_job = PER_JOB_GIB[kind]
    need = RESERVE_GIB + per_job * plan.jobs.value
    have = plan.resources.memory_gib
    if have < need:
        fewest = max(1, int((have - RESERVE_GIB) // per_job))
        yield Finding(
            "memory",
            f"{have:.1f} GiB ({plan.resources.memory_source})",
            f"{need:g} GiB for MAX_JOBS={plan.jobs.value} ({plan.jobs.source}): {per_job:g} GiB per {kind} "
            f"compile job + {RESERVE_GIB:g} GiB reserve (torchkiln.plan.jobs)",
            f"--jobs {fewest}" if have >= RESERVE_GIB + per_job else "a machine with more memory",
        )
