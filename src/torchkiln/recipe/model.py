"""What a loaded recipe is: frozen, typed dataclasses, one per table of the recipe file.

:mod:`torchkiln.recipe.loader` reads a recipe file into these (:data:`~torchkiln.recipe.schema.SCHEMA` says which
field goes where); :mod:`torchkiln.recipe.rules` checks them for compatibility; everything else reads them. This
module imports nothing of torchkiln, so both can depend on it without depending on each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from packaging.version import Version

UPSTREAM_TORCH_REPO = "https://github.com/pytorch/pytorch.git"
UPSTREAM_TORCHVISION_REPO = "https://github.com/pytorch/vision.git"


@dataclass(frozen=True)
class SourceSpec:
    """Where one project's source comes from (``[torch]``, ``[torchvision]``)."""

    name: str  # "torch" or "torchvision": the table's name
    repo: str
    ref: str
    version: Version
    commit: str | None = None


@dataclass(frozen=True)
class Accelerator:
    kind: str  # "cpu" | "cuda"
    cuda: Version | None = None
    arch_list: tuple[str, ...] = ()
    cudnn: Version | None = None  # the cuDNN torch is compiled against (torch._C._cudnn.getCompileVersion())
    nccl: Version | None = None  # the NCCL torch is compiled against (torch.cuda.nccl.version())
    # The cuDNN / NCCL the wheel runs with (the nvidia-cudnn-cuXX / nvidia-nccl-cuXX it requires and loads),
    # where it differs from the compiled one: upstream's 2.8.0 is compiled against cuDNN 9.8.0 and ships
    # 9.10.2.21. None: the same as cudnn / nccl. rules_cuda.py requires the compatibility rule of each
    # library.
    cudnn_runtime: Version | None = None
    nccl_runtime: Version | None = None

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def cudnn_shipped(self) -> Version | None:
        """The cuDNN the wheel runs with: ``cudnn_runtime``, else ``cudnn``."""
        return self.cudnn_runtime or self.cudnn

    @property
    def nccl_shipped(self) -> Version | None:
        """The NCCL the wheel runs with: ``nccl_runtime``, else ``nccl``."""
        return self.nccl_runtime or self.nccl

    @property
    def arch_list_env(self) -> str:
        """TORCH_CUDA_ARCH_LIST as PyTorch's build reads it (semicolon separated)."""
        return ";".join(self.arch_list)


@dataclass(frozen=True)
class Blas:
    kind: str  # "mkl" | "openblas" | "nvpl"
    mkl: Version | None = None


@dataclass(frozen=True)
class VisionFeatures:
    """torchvision's optional parts (``[torchvision.features]``, each its setup.py's TORCHVISION_USE_<NAME>):
    what the wheel is built with. The defaults are what upstream's wheels have (nvJPEG: CUDA recipes).
    ``include_dirs`` / ``library_dirs`` (``torchvision.include_dirs``, ``torchvision.library_dirs``) are
    setup.py's TORCHVISION_INCLUDE / TORCHVISION_LIBRARY: where it looks first for the parts' headers and
    libraries (a libjpeg-turbo in /opt, the Video Codec SDK's headers)."""

    png: bool = True
    jpeg: bool = True
    webp: bool = True
    nvjpeg: bool = False
    video_codec: bool = False
    ffmpeg: bool = False
    include_dirs: tuple[str, ...] = ()
    library_dirs: tuple[str, ...] = ()

    NAMES: ClassVar[tuple[str, ...]] = ("png", "jpeg", "webp", "nvjpeg", "video_codec", "ffmpeg")

    @property
    def enabled(self) -> tuple[str, ...]:
        return tuple(name for name in self.NAMES if getattr(self, name))


@dataclass(frozen=True)
class Magma:
    # Defaults only so that a [magma] table missing a key still loads far enough for the rules to name it.
    version: Version = Version("0")
    sha256: str = ""
    url: str | None = None


@dataclass(frozen=True)
class Build:
    type: str = "Release"
    local_version: str = ""
    jobs: int | None = None
    # How often a compile step resumes with fewer jobs after compiles died for memory (None: the default).
    memory_retries: int | None = None
    gcc: int | None = None
    # The machine the wheels are built on and for (compat.toml [platform.*]); torchkiln does not cross-compile.
    platform: str = "x86_64"
    pytorch_build_version: str | None = None
    pytorch_build_number: int | None = None
    flags: Mapping[str, str] = field(default_factory=dict)
    # More requirements of the build venv (PEP 508, from the index): resolved with the trees' own, pinned in
    # constraints.txt. A tree that builds against an installed package it does not declare gets it here.
    requirements: tuple[str, ...] = ()


@dataclass(frozen=True)
class CacheSpec:
    kind: str = "ccache"
    dir: str | None = None
    max_size: str | None = None
    remote: str | None = None
    credentials_env: str | None = None
    credentials_file: str | None = None


@dataclass(frozen=True)
class ClusterSection:
    """``[cluster]``: compiles sent to an sccache-dist build cluster (docs/distributed.md). Only where the
    token comes from is here, never the token."""

    scheduler_url: str | None = None
    auth: str = "token"
    credentials_env: str | None = None
    credentials_file: str | None = None


@dataclass(frozen=True)
class Deploy:
    """``[deploy]``: what the machines the wheels are installed on provide. ``cuda_libraries``: where a CUDA
    wheel's CUDA libraries come from there: ``pypi`` (NVIDIA's wheels, declared and found through RPATH, as
    upstream's PyPI wheels) or ``bundled`` (carried inside the wheel, upstream's "-full" variant).
    ``system_libraries``: sonames every target machine has (``libpng16.so.16``), which the wheels may need
    without bundling or declaring them (the post-build check and ``verify`` accept them; docs/portability.md)."""

    cuda_libraries: str = "pypi"
    system_libraries: tuple[str, ...] = ()


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    torch: SourceSpec
    torchvision: SourceSpec
    # the first of python_versions: the Python whose paths and step names are a one-Python build's
    python: str
    accelerator: Accelerator
    blas: Blas
    magma: Magma | None
    build: Build
    cache: CacheSpec
    path: Path | None = None
    sha256: str = ""
    document: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    vision: VisionFeatures = field(default_factory=VisionFeatures)
    cluster: ClusterSection | None = None
    # ``python.versions``: every Python the build makes wheels for, in order (empty: ``python.version`` alone)
    pythons: tuple[str, ...] = ()
    deploy: Deploy = field(default_factory=Deploy)

    @property
    def python_versions(self) -> tuple[str, ...]:
        """The Pythons the build makes wheels for: ``python.versions``, else ``(python.version,)``. A free-threaded
        one ends in ``t`` (``3.13t``), as its interpreter's name does (``python3.13t``)."""
        return self.pythons or (self.python,)

    @property
    def torch_build_version(self) -> str:
        """What torchkiln sets as PYTORCH_BUILD_VERSION: the override, or version + local label."""
        return self.build.pytorch_build_version or f"{self.torch.version}{self.build.local_version}"

    @property
    def torch_wheel_version(self) -> str:
        """The version the torch wheel carries. PyTorch appends ``.postN`` to PYTORCH_BUILD_VERSION when
        PYTORCH_BUILD_NUMBER > 1 (tools/generate_torch_version.py ``get_torch_version``, unchanged from
        release/2.10 to 2.15): 2.13.0+cu130 with build number 2 is 2.13.0+cu130.post2 -- after a local
        label that is part of the label, before one (2.13.0.post2) a post-release."""
        number = self.build.pytorch_build_number or 0
        return f"{self.torch_build_version}.post{number}" if number > 1 else self.torch_build_version

    @property
    def torchvision_wheel_version(self) -> str:
        """torchvision's BUILD_VERSION: its release version with torch's local label (no ``.postN``:
        torchvision's setup.py uses BUILD_VERSION as given)."""
        local = Version(self.torch_build_version).local
        return f"{self.torchvision.version}+{local}" if local else str(self.torchvision.version)

    @property
    def source(self) -> str:
        return str(self.path) if self.path else f"<{self.name}>"

    def spec(self, project: str) -> SourceSpec:
        """The source of ``project`` ("torch" or "torchvision")."""
        return {"torch": self.torch, "torchvision": self.torchvision}[project]
