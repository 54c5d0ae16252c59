"""Which base image a recipe's devel, wheels and runtime images start from, and whether the devel image takes
the recipe at all: the tables of the bases (:data:`DISTROS`, :data:`CUDA_IMAGES`, :data:`PYPI_TOOLKITS`,
:data:`MAGMA_BUILDS`) and the choice among them. :mod:`torchkiln.images.spec` builds the images from them;
preflight's fixes (:mod:`torchkiln.plan.preflight_findings`) offer the devel image only where
:func:`devel_problem` finds none, so that the offer is true: one predicate for both.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchkiln.errors import Problem, RecipeError, TorchkilnError, UsageError

from .compat import image_problem, minor
from .model import Recipe


@dataclass(frozen=True)
class Distro:
    """A base distribution: its Python (what ``python3.X`` apt installs) and the gcc majors it packages, its
    image on a registry, and what ``debootstrap`` makes the same root from where no registry is reachable
    (``torchkiln images --base-from debootstrap``): the suite, the archive and the keyring that checks it."""

    python: str
    gcc: tuple[int, ...]
    image: str  # the plain distribution image: CPU recipes, and CUDA recipes with the toolkit from PyPI
    cuda_suffix: str | None  # the nvidia/cuda tag suffix built on it, if NVIDIA publishes one
    suite: str  # debootstrap's SUITE: the codename
    archive: str  # debootstrap's MIRROR (--debootstrap-mirror overrides it)
    keyring: str  # the archive's signing keys on the build host (debian-archive-keyring, ubuntu-keyring)
    ports: str | None = None  # the archive of the other architectures, where it is another (Ubuntu's ports)

    def archive_for(self, deb_arch: str) -> str:
        """The archive holding ``deb_arch``'s packages: Debian serves every architecture from one archive,
        Ubuntu only amd64 and i386 (arm64 is on ports.ubuntu.com, as its arm64 images' sources.list says)."""
        return self.archive if self.ports is None or deb_arch in ("amd64", "i386") else self.ports


DEBIAN_ARCHIVE = "http://deb.debian.org/debian"
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
UBUNTU_ARCHIVE = "http://archive.ubuntu.com/ubuntu"
UBUNTU_KEYRING = "/usr/share/keyrings/ubuntu-archive-keyring.gpg"
UBUNTU_PORTS = "http://ports.ubuntu.com/ubuntu-ports"

# Keyed by the distribution; the Python each one ships is what decides which a recipe gets.
DISTROS: dict[str, Distro] = {
    "ubuntu22.04": Distro(
        "3.10",
        (10, 11, 12),
        "ubuntu:22.04",
        "ubuntu22.04",
        "jammy",
        UBUNTU_ARCHIVE,
        UBUNTU_KEYRING,
        UBUNTU_PORTS,
    ),
    "debian12": Distro(
        "3.11", (12,), "debian:bookworm-slim", None, "bookworm", DEBIAN_ARCHIVE, DEBIAN_KEYRING
    ),
    "ubuntu24.04": Distro(
        "3.12",
        (12, 13, 14),
        "ubuntu:24.04",
        "ubuntu24.04",
        "noble",
        UBUNTU_ARCHIVE,
        UBUNTU_KEYRING,
        UBUNTU_PORTS,
    ),
    "debian13": Distro("3.13", (14,), "debian:trixie-slim", None, "trixie", DEBIAN_ARCHIVE, DEBIAN_KEYRING),
}

# CUDA minor -> the toolkit release of NVIDIA's images (the same toolkit upstream installs:
# .ci/docker/common/install_cuda.sh install_126 ... install_132). 13.4 has no runfile/image yet.
CUDA_IMAGES: dict[str, str] = {
    "12.4": "12.4.1",  # torch 2.6's CUDA 12 build (install_124; Ubuntu 22.04 images)
    "12.6": "12.6.3",
    "12.8": "12.8.1",
    "12.9": "12.9.1",
    "13.0": "13.0.2",
    "13.2": "13.2.1",
}

TOOLKIT_SOURCES = ("pypi", "nvidia")


@dataclass(frozen=True)
class PypiToolkit:
    """One CUDA minor's toolkit as NVIDIA's PyPI wheels: the ``cuda-toolkit`` meta package (its extras
    select the components) and the wheels PyTorch's build links that the meta package does not carry."""

    meta: str
    pins: tuple[str, ...]

    def requirements(self) -> list[str]:
        return [f"cuda-toolkit[{','.join(TOOLKIT_EXTRAS)}]=={self.meta}", *self.pins]


# The components of a devel toolkit. Upstream's torch 2.13.0/2.14.0+cu130 wheels run on
# cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.3 (their
# METADATA Requires-Dist); building adds the compiler (nvcc, crt, nvvm, cccl: nvcc's own headers), culibos
# (static helpers CMake's FindCUDAToolkit attaches to cuBLAS and cuFILE), profiler and nvml (headers NVIDIA's
# devel images carry too: cuda_profiler_api.h, cudaProfiler.h, nvml.h; the libcuda stub reads cudaProfiler.h)
# and nvjpeg (torchvision's GPU JPEG codec, TORCHVISION_USE_NVJPEG).
TOOLKIT_EXTRAS = (
    "cccl",
    "crt",
    "cublas",
    "cudart",
    "cufft",
    "cufile",
    "culibos",
    "cupti",
    "curand",
    "cusolver",
    "cusparse",
    "nvcc",
    "nvjitlink",
    "nvjpeg",
    "nvml",
    "nvrtc",
    "nvtx",
    "nvvm",
    "profiler",
)

# CUDA minor -> its toolkit on PyPI. cuda-toolkit 13.0.3 pins every component exactly (nvcc 13.0.88, cuBLAS
# 13.1.1.3, ...) except nvjitlink (>=13.0.88,<14): pinned here to the toolkit's own release so the image does
# not change with the index. cuSPARSELt 0.8.1 and NVSHMEM 3.4.5 are what torch 2.13.0 and 2.14.0+cu130
# require (METADATA); cuDNN and NCCL come from the recipe. Only CUDA 13 is here: its wheels share one
# layout (nvidia/cu13/{bin,include,lib,nvvm}) that scripts/install_cuda_toolkit.sh merges and that CI builds.
# The same pins resolve for linux/arm64 (pip install --dry-run --only-binary=:all: --platform
# manylinux_2_*_aarch64 --python-version 3.11 of these requirements: every component has a manylinux2014,
# 2_25 or 2_27 aarch64 wheel, e.g. nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_aarch64...whl).
PYPI_TOOLKITS: dict[str, PypiToolkit] = {
    "13.0": PypiToolkit(
        "13.0.3",
        ("nvidia-nvjitlink==13.0.88", "nvidia-cusparselt-cu13==0.8.1", "nvidia-nvshmem-cu13==3.4.5"),
    ),
}

# MAGMA releases torchkiln knows how to build: scripts/install_magma.sh applies its edits for that release
# (PyTorch's .ci/magma/build_magma.sh builds MAGMA_VERSION=2.6.1 with its package_files/*.patch).
MAGMA_BUILDS = ("2.6.1",)


def toolkit_source(recipe: Recipe, choice: str = "auto") -> str | None:
    """Where a CUDA recipe's toolkit comes from: 'pypi' or 'nvidia' (None for a CPU recipe).

    ``auto`` is ``pypi`` when :data:`PYPI_TOOLKITS` has the recipe's CUDA (no NVIDIA registry needed, only a
    package index), else ``nvidia``."""
    if choice not in ("auto", *TOOLKIT_SOURCES):
        raise UsageError(
            f"--cuda-from {choice!r} is not a toolkit source (valid: auto, {', '.join(TOOLKIT_SOURCES)})"
        )
    acc = recipe.accelerator
    if not acc.is_cuda or acc.cuda is None:
        return None
    cuda = minor(acc.cuda)
    if choice == "auto":
        return "pypi" if cuda in PYPI_TOOLKITS else "nvidia"
    if choice == "pypi" and cuda not in PYPI_TOOLKITS:
        raise RecipeError(
            [
                Problem(
                    recipe.source,
                    "accelerator.cuda",
                    f"no CUDA {cuda} toolkit known on PyPI",
                    f"{', '.join(PYPI_TOOLKITS)}, or --cuda-from nvidia (NVIDIA's images)",
                )
            ]
        )
    return choice


def distro_for(recipe: Recipe, source: str | None = None, *, check_gcc: bool = True) -> tuple[str, Distro]:
    """The distribution whose own Python is the recipe's (and, for the ``nvidia`` toolkit source, that
    NVIDIA builds images on). ``check_gcc``: the recipe's gcc must be one it packages (devel images)."""
    nvidia = source == "nvidia"
    candidates = [
        (key, d) for key, d in DISTROS.items() if d.python == recipe.python and (not nvidia or d.cuda_suffix)
    ]
    if not candidates:
        valid = sorted({d.python for d in DISTROS.values() if not nvidia or d.cuda_suffix})
        kind = "NVIDIA CUDA" if nvidia else "distribution"
        raise RecipeError(
            [
                Problem(
                    recipe.source,
                    "python.version",
                    f"no {kind} base image ships Python {recipe.python}",
                    f"{', '.join(valid)}, or pass --base-image with a python{recipe.python}",
                )
            ]
        )
    key, distro = candidates[0]
    gcc = recipe.build.gcc
    if check_gcc and gcc is not None and gcc not in distro.gcc:
        raise RecipeError(
            [
                Problem(
                    recipe.source,
                    "build.gcc",
                    f"gcc {gcc} is not packaged by {key} (the base for Python {recipe.python})",
                    ", ".join(map(str, distro.gcc)),
                )
            ]
        )
    return key, distro


def nvidia_toolkit(recipe: Recipe) -> str:
    cuda = minor(recipe.accelerator.cuda) if recipe.accelerator.cuda else ""
    toolkit = CUDA_IMAGES.get(cuda)
    if toolkit is None:
        raise RecipeError(
            [
                Problem(
                    recipe.source,
                    "accelerator.cuda",
                    f"no NVIDIA CUDA image known for CUDA {cuda}",
                    f"{', '.join(CUDA_IMAGES)}, or pass --base-image/--runtime-base-image",
                )
            ]
        )
    return toolkit


def devel_problem(recipe: Recipe, cuda_from: str = "auto") -> str | None:
    """Why ``torchkiln images --recipe R --target devel`` makes no devel image that builds ``recipe`` (None:
    it makes one): its platform or BLAS (compat.image_problem), several Pythons (the image installs one, the
    base's python3), a Python or gcc no base packages, no toolkit image of its CUDA, a MAGMA the image cannot
    build. The same checks as :func:`torchkiln.images.spec.devel_args`."""
    if (problem := image_problem(recipe, "devel")) is not None:
        return problem
    if len(recipe.python_versions) > 1:
        return f"{recipe.source}: python.versions: the devel image installs one Python (its base's python3)"
    magma = recipe.magma if recipe.accelerator.is_cuda else None
    try:
        if magma is not None and str(magma.version) not in MAGMA_BUILDS:
            return f"{recipe.source}: magma.version: the images build MAGMA {', '.join(MAGMA_BUILDS)} only"
        source = toolkit_source(recipe, cuda_from)
        distro_for(recipe, source)
        if source == "nvidia":
            nvidia_toolkit(recipe)
    except TorchkilnError as exc:
        return str(exc)
    return None
