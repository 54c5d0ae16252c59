"""Which runtime cuDNN and NCCL a torch compiled against another version may run with: one rule per library,
read by the recipe's rules (``accelerator.cudnn_runtime`` / ``nccl_runtime``) and by verify's checks of an
installed build (the runtime library it loaded, the NVIDIA package it installed).

cuDNN, NVIDIA's "cuDNN API Compatibility" (https://docs.nvidia.com/deeplearning/cudnn/latest/developer/
forward-compatibility.html, the same text from 9.5.1 on): "Beginning in cuDNN 7 ... any patch release x.y.z
is forward or backward-compatible with applications built against another cuDNN patch release x.y.w"; "cuDNN
minor releases are binary backward-compatible with applications built against the same or earlier minor
release (meaning, cuDNN x.y is binary compatible with an app built against cuDNN x.z, where z<=y)"; "API
compatibility is not guaranteed across major versions". torch applies the same rule when it first uses
cuDNN (torch/backends/cudnn/__init__.py ``_init``: same major, runtime minor >= compile minor, else
"cuDNN version incompatibility"). Upstream's torch 2.8.0+cu128 is compiled against 9.8.0 and requires (and
loads) nvidia-cudnn-cu12 9.10.2.21: compatible.

NCCL documents no such promise. What holds in practice: one soname per major (``libnccl.so.2``), and minor and
patch releases add functions a torch compiled against them calls (pytorch#119072, #119932: "undefined symbol:
ncclCommRegister" with a runtime NCCL older than the compiled one). So the runtime NCCL must have the
compiled major and be at least as new as the compiled release (major.minor.patch).

Pure functions over ``packaging`` versions: nothing here imports torch.
"""

from __future__ import annotations

from packaging.version import Version

CUDNN_RULE = "cuDNN runs a program built against x.a with x.b for b >= a, same major (NVIDIA's cuDNN API Compatibility)"
NCCL_RULE = "NCCL: the same major (libnccl.so.2) and at least the compiled release"


def _parts(version: Version, count: int) -> tuple[int, ...]:
    return tuple((version.release + (0,) * count)[:count])


def cudnn_problem(compiled: Version, runtime: Version) -> str | None:
    """Why a torch compiled against cuDNN ``compiled`` cannot run with ``runtime`` (None: it can)."""
    if compiled.major != runtime.major:
        return (
            f"cuDNN {runtime} is another major than the compiled {compiled} (no compatibility across majors)"
        )
    if _parts(runtime, 2) < _parts(compiled, 2):
        return f"cuDNN {runtime} is older than the compiled {compiled} (a minor release runs only programs built against it or earlier)"
    return None


def nccl_problem(compiled: Version, runtime: Version) -> str | None:
    """Why a torch compiled against NCCL ``compiled`` cannot run with ``runtime`` (None: it can)."""
    if compiled.major != runtime.major:
        return f"NCCL {runtime} is another major than the compiled {compiled} (another soname)"
    if _parts(runtime, 3) < _parts(compiled, 3):
        return f"NCCL {runtime} is older than the compiled {compiled} (it may lack functions torch calls)"
    return None
