"""Container images of a recipe: which base, which build args, which tags and labels.

Everything the Dockerfiles in ``docker/`` take as ``ARG`` is computed here, from the recipe, in one place:
:data:`DISTROS`, :data:`CUDA_IMAGES`, :data:`PYPI_TOOLKITS` and :data:`MAGMA_BUILDS` are the tables,
:func:`devel_args` / :func:`runtime_args` the two mappings. ``torchkiln images`` and the generated
``docker-bake.json`` (:mod:`torchkiln.images.bake`) both use them, so a plain ``docker buildx bake`` and
``torchkiln images`` build the same thing.

A CUDA recipe's toolkit comes from one of two sources (:data:`TOOLKIT_SOURCES`): ``pypi``, NVIDIA's CUDA
wheels on a plain distribution image (any PyPI mirror will do; the default wherever :data:`PYPI_TOOLKITS`
has the recipe's CUDA), or ``nvidia``, NVIDIA's ``nvidia/cuda`` devel and runtime images.

The runtime image takes its wheels from a build context named ``dist``: a directory a build published
into, whose ``manifest.json`` says which wheels they are, from which commits and which recipe
(:func:`runtime_args`), or in bake the ``wheels`` stage of the devel Dockerfile.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from packaging.version import Version

from torchkiln import __version__
from torchkiln.artifacts.manifest import Manifest
from torchkiln.artifacts.provenance import statement_name
from torchkiln.artifacts.signing import PublicKey, keyid, load_envelope, verify
from torchkiln.errors import DocumentError, Problem, RecipeError, TorchkilnError, UsageError, few
from torchkiln.files.digests import file_sha256
from torchkiln.images.platforms import image_platform
from torchkiln.recipe.model import Recipe

FLAVOURS = ("devel", "wheels", "runtime")
DEFAULT_REGISTRY = "localhost"
IMAGE_NAME = "torchkiln"
CACHE_SECRET_ID = "cache_password"
# The build cluster's client token (distributed compiles): a secret of the compiling step, read where a
# BuildKit secret lands, so the recipe's [dist] says credentials_file = DIST_SECRET_FILE.
DIST_SECRET_ID = "dist_token"
DIST_SECRET_FILE = f"/run/secrets/{DIST_SECRET_ID}"
# pip's configuration for every pip step of an image build (a package index mirror, its credentials):
# a secret mounted at /etc/pip.conf (pip's global configuration file) for that step only.
PIP_CONFIG_SECRET_ID = "pip_config"
SOURCE_URL = "https://github.com/torchkiln/torchkiln"

# Repository paths, relative to the build context (a torchkiln checkout).
DOCKERFILES = {
    "devel": "docker/Dockerfile.devel",
    "wheels": "docker/Dockerfile.devel",
    "runtime": "docker/Dockerfile.runtime",
}


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

# torchvision's optional parts -> the distribution packages its setup.py looks for when building them
# (libpng-config, jpeglib.h, webp/decode.h). nvjpeg comes with the CUDA toolkit; the video decoders are
# gone from torchvision since 0.24 (rules refuse them there).
VISION_DEV_PACKAGES: dict[str, tuple[str, ...]] = {
    "png": ("libpng-dev",),
    "jpeg": ("libjpeg-dev",),
    "webp": ("libwebp-dev",),
}


def _minor(version: Version) -> str:
    return f"{version.major}.{version.minor}"


def accelerator_tag(recipe: Recipe) -> str:
    """'cpu' or 'cu130': the accelerator part of image tags and wheel local labels."""
    acc = recipe.accelerator
    if not acc.is_cuda or acc.cuda is None:
        return "cpu"
    return f"cu{acc.cuda.major}{acc.cuda.minor}"


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
    cuda = _minor(acc.cuda)
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


def _nvidia_toolkit(recipe: Recipe) -> str:
    cuda = _minor(recipe.accelerator.cuda) if recipe.accelerator.cuda else ""
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


def devel_base(recipe: Recipe, cuda_from: str = "auto") -> str:
    """The devel image's base: the plain distribution image (CPU, or the toolkit from PyPI), or NVIDIA's
    devel image for the recipe's CUDA (nvcc, headers)."""
    source = toolkit_source(recipe, cuda_from)
    _, distro = distro_for(recipe, source)
    if source != "nvidia":
        return distro.image
    return f"nvidia/cuda:{_nvidia_toolkit(recipe)}-devel-{distro.cuda_suffix}"


def runtime_base(recipe: Recipe, cuda_from: str = "auto") -> str:
    """The runtime image's base: the plain distribution image (the CUDA libraries then come as the wheels'
    own dependencies from the package index, as they do for upstream's PyPI torch), or NVIDIA's runtime
    image. No compiler goes in, so the recipe's gcc does not matter here."""
    source = toolkit_source(recipe, cuda_from)
    _, distro = distro_for(recipe, source, check_gcc=False)
    if source != "nvidia":
        return distro.image
    return f"nvidia/cuda:{_nvidia_toolkit(recipe)}-runtime-{distro.cuda_suffix}"


def plain_distro(recipe: Recipe, target: str, cuda_from: str = "auto") -> tuple[str, Distro]:
    """The distribution (key, row) whose plain image is ``target``'s base, for making that base locally
    (``--base-from debootstrap``); UsageError when the base is NVIDIA's image, which no archive makes."""
    source = toolkit_source(recipe, cuda_from)
    if source == "nvidia":
        raise UsageError(
            "--base-from debootstrap: this build's base is NVIDIA's CUDA image (--cuda-from nvidia), which "
            "debootstrap cannot make (valid: --cuda-from pypi, where torchkiln knows the recipe's CUDA on PyPI: "
            f"{', '.join(PYPI_TOOLKITS)}; or --base-rootfs with a root that has the toolkit)"
        )
    return distro_for(recipe, source, check_gcc=target != "runtime")


def base_images(recipe: Recipe, cuda_from: str = "auto") -> tuple[str, str]:
    """(devel base, runtime base) for the toolkit source ``cuda_from``."""
    return devel_base(recipe, cuda_from), runtime_base(recipe, cuda_from)


def _s(value: object | None) -> str:
    return "" if value is None else str(value)


def devel_args(recipe: Recipe, *, base_image: str | None = None, cuda_from: str = "auto") -> dict[str, str]:
    """Build args of docker/Dockerfile.devel (stages devel, build, wheels) for a recipe."""
    acc = recipe.accelerator
    magma = recipe.magma if acc.is_cuda else None
    if magma is not None and str(magma.version) not in MAGMA_BUILDS:
        raise RecipeError(
            [
                Problem(
                    recipe.source,
                    "magma.version",
                    f"torchkiln's images do not know how to build MAGMA {magma.version}",
                    ", ".join(MAGMA_BUILDS),
                )
            ]
        )
    source = toolkit_source(recipe, cuda_from)
    if base_image is None:
        base_image = devel_base(recipe, cuda_from)
    wheels = PYPI_TOOLKITS[_minor(acc.cuda)].requirements() if source == "pypi" and acc.cuda else []
    vision_packages = [pkg for f in recipe.vision.enabled for pkg in VISION_DEV_PACKAGES.get(f, ())]
    return {
        "BASE_IMAGE": base_image,
        "KILN_PYTHON": recipe.python,
        "KILN_GCC": _s(recipe.build.gcc),
        "KILN_CUDA": _minor(acc.cuda) if acc.is_cuda and acc.cuda else "",
        "KILN_CUDA_FROM": source or "",
        "KILN_TOOLKIT_TARGET": image_platform(recipe).toolkit_target if acc.is_cuda else "",
        "QEMU_CPU": image_platform(recipe).qemu_cpu,
        "KILN_CUDA_WHEELS": " ".join(wheels),
        "KILN_CUDNN": _s(acc.cudnn) if acc.is_cuda else "",
        "KILN_NCCL": _s(acc.nccl) if acc.is_cuda else "",
        "KILN_CUDA_ARCH_LIST": acc.arch_list_env if acc.is_cuda else "",
        "KILN_MKL": _s(recipe.blas.mkl) if recipe.blas.kind == "mkl" else "",
        "KILN_OPENBLAS": "1" if recipe.blas.kind == "openblas" else "",
        "KILN_MAGMA_VERSION": _s(magma.version) if magma else "",
        "KILN_MAGMA_URL": _s(magma.url) if magma else "",
        "KILN_MAGMA_SHA256": magma.sha256 if magma else "",
        "KILN_VISION_PACKAGES": " ".join(vision_packages),
        "RECIPE_FILE": recipe_file(recipe),
        "CACHE_CREDENTIALS_ENV": _s(recipe.cache.credentials_env),
    }


def recipe_file(recipe: Recipe) -> str:
    """The recipe's file name inside the ``recipe`` build context (its directory)."""
    return recipe.path.name if recipe.path else f"{recipe.name}.toml"


def runtime_args(
    recipe: Recipe,
    manifest: Manifest | None = None,
    *,
    manifest_file: str = "manifest.json",
    base_image: str | None = None,
    cuda_from: str = "auto",
) -> dict[str, str]:
    """Build args of docker/Dockerfile.runtime. With the ``manifest`` of the build whose dist/ the image
    installs (:func:`torchkiln.artifacts.dist.read_published`), the exact wheel versions, source commits and the
    recipe's name and sha256 are the manifest's; it must be this recipe's build. Without one, from the recipe
    (the bake file, whose runtime targets take their wheels from the ``wheels`` stage: the image's sanity
    gate then compares them with the manifest that stage exported)."""
    acc = recipe.accelerator
    if base_image is None:
        base_image = runtime_base(recipe, cuda_from)
    return {
        "BASE_IMAGE": base_image,
        "KILN_PYTHON": recipe.python,
        "KILN_CUDA": _minor(acc.cuda) if acc.is_cuda and acc.cuda else "",
        "KILN_CUDNN": _s(acc.cudnn) if acc.is_cuda else "",
        "KILN_NCCL": _s(acc.nccl) if acc.is_cuda else "",
        **(
            _built_from_manifest(recipe, manifest, manifest_file)
            if manifest is not None
            else _built_from_recipe(recipe)
        ),
        "RECIPE_FILE": recipe_file(recipe),
        "TORCHKILN_VERSION": __version__,
        "QEMU_CPU": image_platform(recipe).qemu_cpu,
    }


def _built_from_recipe(recipe: Recipe) -> dict[str, str]:
    return {
        "KILN_TORCH_VERSION": recipe.torch_wheel_version,
        "KILN_TORCHVISION_VERSION": recipe.torchvision_wheel_version,
        "KILN_TORCH_COMMIT": _s(recipe.torch.commit),
        "KILN_TORCHVISION_COMMIT": _s(recipe.torchvision.commit),
        "RECIPE_NAME": recipe.name,
        "RECIPE_SHA256": recipe.sha256,
    }


def _built_from_manifest(recipe: Recipe, manifest: Manifest, file: str) -> dict[str, str]:
    """What the manifest says was built: the wheels' versions, the commits their sources were at."""
    built = manifest.recipe
    if built.sha256 != recipe.sha256:
        raise DocumentError(
            [
                Problem(
                    file,
                    "recipe",
                    f"the wheels were built from {built.name} (sha256 {built.sha256[:12]}...), not from "
                    f"{recipe.source} (sha256 {recipe.sha256[:12]}...)",
                    "the recipe the wheels were built with, or build them again with this one",
                )
            ]
        )
    torch = manifest.wheel("torch")
    if torch is None:
        listed = few([w.name for w in manifest.wheels]) or "no wheels"
        raise DocumentError(
            [Problem(file, "wheels", f"no torch wheel (it lists: {listed})", "a torch wheel")]
        )
    vision = manifest.wheel("torchvision")

    def commit(project: str) -> str:
        source = manifest.sources.get(project)
        return _s(source.commit) if source is not None else ""

    return {
        "KILN_TORCH_VERSION": torch.version,
        "KILN_TORCHVISION_VERSION": vision.version if vision else "",
        "KILN_TORCH_COMMIT": commit("torch"),
        "KILN_TORCHVISION_COMMIT": commit("torchvision") if vision else "",
        "RECIPE_NAME": built.name,
        "RECIPE_SHA256": built.sha256,
    }


def provenance_args(dist: Path, manifest: Manifest, key: PublicKey | None) -> dict[str, str]:
    """Build args of the runtime image for the signed provenance statement in ``dist`` (``torchkiln build
    --sign-key-*`` wrote it): its file name and sha256 (the image keeps the file and labels it with its
    digest) and, with ``key``, the public key (base64 DER: public, a build arg like any other), against
    which the statement is checked here first and by the image's sanity gate again. Empty without one."""
    path = dist / statement_name(manifest.recipe.name)
    args = dict.fromkeys(
        ("KILN_PROVENANCE", "KILN_PROVENANCE_SHA256", "KILN_PROVENANCE_KEY", "KILN_PROVENANCE_KEYID"), ""
    )
    if not path.is_file():
        if key is not None:
            raise UsageError(
                f"--provenance-key: {path}: no such file (valid: a dist/ that torchkiln build --sign-key-file "
                "or --sign-key-env published into)"
            )
        return args
    args["KILN_PROVENANCE"] = path.name
    args["KILN_PROVENANCE_SHA256"] = file_sha256(path)
    if key is not None:
        verdict = verify(load_envelope(path, "--dist"), key)
        if not verdict.ok:
            raise TorchkilnError(f"{path}: {verdict.message} (--provenance-key)")
        der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        args["KILN_PROVENANCE_KEY"] = base64.b64encode(der).decode("ascii")
        args["KILN_PROVENANCE_KEYID"] = keyid(key)
    return args


# ------------------------------------------------------------------------------------------------------
# Tags and labels.
# ------------------------------------------------------------------------------------------------------


def image_tag(recipe: Recipe, flavour: str, registry: str = DEFAULT_REGISTRY) -> str:
    """``<registry>/torchkiln:<torch version>-<cpu|cuXY>[-<arch>]-<flavour>``, e.g.
    ``.../torchkiln:2.14.0-cu130-devel``; images of another machine than linux/amd64 name its Debian
    architecture (``2.13.0-cu130-arm64-runtime``), so an x86_64 and an aarch64 recipe of a release never
    share a tag."""
    if flavour not in FLAVOURS:
        raise UsageError(f"unknown image flavour {flavour!r} (valid: {', '.join(FLAVOURS)})")
    registry = registry.rstrip("/")
    prefix = f"{registry}/" if registry else ""
    arch = image_platform(recipe).deb_arch
    machine = "" if arch == "amd64" else f"-{arch}"
    return f"{prefix}{IMAGE_NAME}:{recipe.torch.version}-{accelerator_tag(recipe)}{machine}-{flavour}"


def image_labels(recipe: Recipe, flavour: str) -> dict[str, str]:
    """OCI labels every image carries. The runtime image's version labels come from its Dockerfile (the
    wheel actually installed, which may be an upstream wheel of the same release), not from the recipe."""
    labels = {
        "org.opencontainers.image.title": f"torchkiln {flavour} ({recipe.name})",
        "org.opencontainers.image.version": str(recipe.torch_wheel_version),
        "io.torchkiln.recipe": recipe.name,
        "io.torchkiln.recipe-sha256": recipe.sha256,
    }
    if flavour == "runtime":
        del labels["org.opencontainers.image.version"]
    return labels
