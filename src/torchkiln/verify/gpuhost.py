"""Whether this machine has an NVIDIA GPU, asked without CUDA, and so whether verify must require CUDA.

On a machine without a GPU a CUDA check can only be skipped. On a machine *with* one, the same skip means
CUDA is broken there (a driver too old for the build, a missing ``libcuda``, a container started without
the GPU runtime): every CUDA check would skip and verify would pass. So the suite asks the machine itself,
through what the NVIDIA kernel driver and its tools expose, none of which needs CUDA to work:

* ``/dev/nvidia0``, ``/dev/nvidia1``, ...: one device node per GPU, created by the driver (or its
  container runtime);
* ``/proc/driver/nvidia/gpus/<PCI address>/``: one directory per GPU the kernel module bound;
* ``nvidia-smi -L`` (NVML's command line): ``GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)``, one line per GPU
  (nvidia-smi(1) ``--list-gpus``; torch's ``collect_env.py`` reads the same lines).

Any of them is enough. A CUDA build on such a machine must pass its CUDA checks unless the caller says
otherwise (``--no-require-cuda``). Nothing here imports torch; ``nvidia-smi`` runs bounded, through :mod:`torchkiln.process.runner`.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from torchkiln.process import runner

_DEVICE_NODE_RE = re.compile(r"nvidia\d+")
_SMI_GPU_RE = re.compile(r"GPU \d+: .+")
SMI_TIMEOUT_S = 30.0  # nvidia-smi answers in well under a second; a hung driver must not hang verify


@dataclass(frozen=True)
class GpuHost:
    """What this machine shows of NVIDIA GPUs: each source that saw one, in words. Empty: none."""

    evidence: tuple[str, ...] = ()

    @property
    def found(self) -> bool:
        return bool(self.evidence)

    def describe(self) -> str:
        return "; ".join(self.evidence) if self.evidence else "no NVIDIA GPU found"


def _device_nodes(root: Path) -> str | None:
    nodes = sorted(p.name for p in (root / "dev").glob("nvidia*") if _DEVICE_NODE_RE.fullmatch(p.name))
    return f"device nodes /dev/{', /dev/'.join(nodes)}" if nodes else None


def _driver_gpus(root: Path) -> str | None:
    gpus = root / "proc" / "driver" / "nvidia" / "gpus"
    try:
        bound = sorted(p.name for p in gpus.iterdir())
    except OSError:
        return None
    return f"the NVIDIA driver lists {', '.join(bound)} in /proc/driver/nvidia/gpus" if bound else None


def _smi_gpus(smi: str | None) -> str | None:
    if smi is None:
        return None
    try:
        done = runner.run([smi, "-L"], timeout=SMI_TIMEOUT_S, reap=True)
    except (runner.ProcessError, OSError):  # not there, not executable
        return None
    gpus = [line.strip() for line in done.stdout.splitlines() if _SMI_GPU_RE.fullmatch(line.strip())]
    if done.returncode != 0 or not gpus:
        return None
    names = [re.sub(r" \(UUID: [^)]*\)$", "", gpu) for gpu in gpus]
    return f"nvidia-smi -L lists {'; '.join(names)}"


def detect(root: Path = Path("/"), smi: str | None = None) -> GpuHost:
    """Look for NVIDIA GPUs under ``root`` (``/``: this machine) and through ``smi`` (default: the
    ``nvidia-smi`` on PATH)."""
    smi = smi if smi is not None else shutil.which("nvidia-smi")
    found = (_device_nodes(root), _driver_gpus(root), _smi_gpus(smi))
    return GpuHost(tuple(e for e in found if e))


def require_cuda(option: bool | None, *, cuda_build: bool, host: GpuHost) -> tuple[bool, str]:
    """Whether CUDA checks must run (a skip is then a failure), and why, in words for the report.

    ``option``: ``--require-cuda`` (True), ``--no-require-cuda`` (False) or neither (None: decided here
    from the build and the machine)."""
    if option is True:
        return True, "--require-cuda was given"
    if option is False:
        return False, "--no-require-cuda was given"
    if not cuda_build:
        return False, "torch is not a CUDA build"
    if host.found:
        return True, (
            f"this machine has an NVIDIA GPU ({host.describe()}) and torch is a CUDA build, so a CUDA check "
            "that cannot run means CUDA is broken here; --no-require-cuda lets them skip"
        )
    return False, "no NVIDIA GPU on this machine (no /dev/nvidia<N>, /proc/driver/nvidia/gpus or nvidia-smi)"
