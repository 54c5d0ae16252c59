"""How many compile jobs a build may run: from cores AND memory, so a build is never OOM-killed at 90%.

PyTorch's heaviest translation units (flash-attention CUDA kernels) need 3-5 GB each (pytorch#124018,
flash-attention PR #2079); plain C++ units up to about 2 GB. ``MAX_JOBS = min(cores, (memory - reserve) /
per-job)``, at least 1. An explicit value (``--jobs`` first, then the recipe's ``build.jobs``) wins.

Memory is the lower of ``/proc/meminfo``'s MemTotal and the limit of this process's own cgroup (v2 or v1, its
ancestors included: :mod:`torchkiln.host.cgroup`), and the plan says which of them it was. The estimates
are only estimates: a compile the kernel kills for memory anyway is resumed with fewer jobs
(:mod:`torchkiln.build.memory`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from torchkiln.artifacts.manifest import Jobs
from torchkiln.host import cgroup

GIB = 1024**3

# Peak resident memory of one compile job, by accelerator kind (GiB).
PER_JOB_GIB: dict[str, float] = {"cpu": 2.0, "cuda": 4.5}
# Memory left for the linker, the build driver and the rest of the machine (GiB).
RESERVE_GIB = 2.0


@dataclass(frozen=True)
class Resources:
    """What the build may use: CPUs and memory, after cgroup (container) limits."""

    cpus: int
    memory_bytes: int
    memory_source: str = "/proc/meminfo MemTotal"  # what set memory_bytes: MemTotal or a cgroup's limit

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB


def _meminfo_total(meminfo: Path) -> int:
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise OSError(f"no MemTotal in {meminfo}")


def detect_resources(sysroot: Path = Path("/")) -> Resources:
    """CPUs (affinity, capped by the cgroup's CPU quota) and memory (MemTotal, capped by the cgroup's memory
    limit), the cgroup being this process's own (``sysroot``: where /proc and /sys are, for the tests)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    group = cgroup.find("cpu", sysroot=sysroot)
    quota = group.limit() if group is not None else None
    if quota is not None:
        cpus = max(1, min(cpus, int(quota.value)))
    memory = _meminfo_total(sysroot / "proc/meminfo")
    group = cgroup.find("memory", sysroot=sysroot)
    limit = group.limit() if group is not None else None
    if limit is not None and limit.value < memory:
        return Resources(cpus, int(limit.value), limit.file)
    return Resources(cpus, memory)


def decide_jobs(
    kind: str, resources: Resources, *, cli: int | None = None, recipe: int | None = None
) -> Jobs:
    """MAX_JOBS for a build of accelerator ``kind`` on ``resources``."""
    if cli is not None:
        return Jobs(cli, "--jobs", "given on the command line")
    if recipe is not None:
        return Jobs(recipe, "recipe", "build.jobs in the recipe")
    per_job = PER_JOB_GIB[kind]
    by_memory = int((resources.memory_gib - RESERVE_GIB) // per_job)
    value = max(1, min(resources.cpus, by_memory))
    limit = "cores" if resources.cpus <= by_memory else "memory"
    return Jobs(
        value,
        "auto",
        f"min({resources.cpus} cores, ({resources.memory_gib:.1f} GiB by {resources.memory_source} - "
        f"{RESERVE_GIB:g} GiB reserve) / "
        f"{per_job:g} GiB per {kind} job = {max(by_memory, 0)}); limited by {limit}",
    )
