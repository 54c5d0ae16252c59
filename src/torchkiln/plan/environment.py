"""The environment table: every variable torchkiln sets for a project's build, and why.

Each :class:`EnvVar` row names a variable, the project(s) whose build reads it, how its value follows from
the recipe (:class:`EnvInputs`), and why it is set. A step's process environment is composed in layers
(:mod:`torchkiln.process.environ`): the caller's environment without anything that steers the build, these
variables (``Step.env``), for compile steps the compiler cache's public variables (``Step.cache_env``), and at
run time only the cache's secret layer.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from torchkiln.recipe import cuda_libraries
from torchkiln.recipe.compat import blas_kind, platform_data
from torchkiln.recipe.model import Recipe

from .model import PROJECTS, Paths


@dataclass(frozen=True)
class EnvInputs:
    """What an ENV_TABLE row may read."""

    recipe: Recipe
    paths: Paths
    jobs: int
    frontend: str
    torch_version: str | None = None  # --torch: the given torch's, else the recipe's wheel version

    @property
    def torch_wheel_version(self) -> str:
        return self.torch_version or self.recipe.torch_wheel_version

    @property
    def cuda(self) -> bool:
        return self.recipe.accelerator.is_cuda

    @property
    def cuda_home(self) -> str:
        return f"/usr/local/cuda-{self.recipe.accelerator.cuda}"


def _bool(value: bool) -> str:
    return "1" if value else "0"


def _build_type_flag(flag: str) -> Callable[[EnvInputs], str | None]:
    wanted = {"DEBUG": "Debug", "REL_WITH_DEB_INFO": "RelWithDebInfo"}[flag]
    return lambda c: "1" if c.recipe.build.type == wanted else None


def _gcc(c: EnvInputs, driver: str) -> str | None:
    """``gcc-13`` / ``g++-13`` for build.gcc = 13; unset without build.gcc (the caller's CC/CXX, else cc/c++)."""
    return f"{driver}-{c.recipe.build.gcc}" if c.recipe.build.gcc is not None else None


def _nvcc_flags(c: EnvInputs) -> str | None:
    if not c.cuda:
        return None
    flags = "-Xfatbin -compress-all"
    cuda = c.recipe.accelerator.cuda
    if cuda is not None and cuda.major >= 13:
        flags += " -compress-mode=size"
    return flags


def _platform_env(name: str) -> Callable[[EnvInputs], str | None]:
    """The value data/compat.toml's ``[platform.<build.platform>] build_env`` gives ``name`` (None: not set
    on that platform): what upstream's build sets on aarch64 and not on x86_64, as data."""
    return lambda c: platform_data(c.recipe)["build_env"].get(name)


@dataclass(frozen=True)
class EnvVar:
    name: str
    projects: tuple[str, ...]
    value: Callable[[EnvInputs], str | None]  # None: not set
    why: str


TORCH, VISION, BOTH = ("torch",), ("torchvision",), PROJECTS

ENV_TABLE: tuple[EnvVar, ...] = (
    # -- accelerator ---------------------------------------------------------------------------------
    EnvVar(
        "USE_CUDA",
        TORCH,
        lambda c: _bool(c.cuda),
        "explicit: CUDA is auto-enabled when found (pytorch#84162)",
    ),
    EnvVar(
        "TORCH_CUDA_ARCH_LIST",
        BOTH,
        lambda c: c.recipe.accelerator.arch_list_env if c.cuda else None,
        "never empty for CUDA: defaults include compute_50, which nvcc 13 rejects",
    ),
    EnvVar(
        "CUDA_HOME",
        BOTH,
        lambda c: c.cuda_home if c.cuda else None,
        "the toolkit of the recipe's CUDA version",
    ),
    EnvVar(
        "CUDACXX",
        TORCH,
        lambda c: f"{c.cuda_home}/bin/nvcc" if c.cuda else None,
        "CMake uses this nvcc, not whichever is first on PATH",
    ),
    EnvVar(
        "TORCH_NVCC_FLAGS",
        TORCH,
        _nvcc_flags,
        "upstream's fatbin compression (-compress-mode=size on CUDA 13)",
    ),
    EnvVar(
        "USE_CUDNN", TORCH, lambda c: _bool(c.recipe.accelerator.cudnn is not None), "cuDNN asked for or not"
    ),
    EnvVar("USE_STATIC_CUDNN", TORCH, lambda c: "0" if c.cuda else None, "link the system cuDNN dynamically"),
    EnvVar(
        "USE_NCCL", TORCH, lambda c: _bool(c.recipe.accelerator.nccl is not None), "NCCL asked for or not"
    ),
    EnvVar(
        "USE_SYSTEM_NCCL", TORCH, lambda c: "1" if c.cuda else None, "the pinned NCCL, not the submodule's"
    ),
    EnvVar(
        "USE_STATIC_NCCL", TORCH, lambda c: "0" if c.cuda else None, "link NCCL dynamically (upstream wheels)"
    ),
    EnvVar(
        "NCCL_ROOT",
        TORCH,
        lambda c: c.cuda_home if c.cuda else None,
        "pinned NCCL installed with CUDA (cmake/Modules/FindNCCL.cmake: NCCL_ROOT_DIR is deprecated)",
    ),
    EnvVar(
        "NCCL_INCLUDE_DIR", TORCH, lambda c: f"{c.cuda_home}/include" if c.cuda else None, "see NCCL_ROOT"
    ),
    EnvVar("NCCL_LIB_DIR", TORCH, lambda c: f"{c.cuda_home}/lib64" if c.cuda else None, "see NCCL_ROOT"),
    EnvVar(
        "PYTORCH_EXTRA_INSTALL_REQUIREMENTS",
        TORCH,
        lambda c: cuda_libraries.extra_install_requirements(c.recipe),
        "the wheel's Requires-Dist on NVIDIA's PyPI wheels, as upstream's (deploy.cuda_libraries = pypi; "
        "data/compat.toml [cuda_libraries]); the torch:repair step adds the RPATH that finds them",
    ),
    EnvVar(
        "FORCE_CUDA",
        VISION,
        lambda c: _bool(c.cuda),
        "torchvision builds CUDA ops only when a GPU is visible unless forced (GPU-less builders)",
    ),
    # -- the host compiler of build.gcc: Debian's and Ubuntu's versioned names (gcc-13, g++-13), which the
    # devel images install; preflight checks that this host has them and that they are that gcc ----------
    EnvVar("CC", BOTH, lambda c: _gcc(c, "gcc"), "build.gcc (CMake, setuptools and cpp_extension read CC)"),
    EnvVar("CXX", BOTH, lambda c: _gcc(c, "g++"), "build.gcc (CMake, setuptools and cpp_extension read CXX)"),
    EnvVar(
        "CUDAHOSTCXX",
        TORCH,
        lambda c: _gcc(c, "g++") if c.cuda else None,
        "build.gcc as nvcc's host compiler (CMake reads CUDAHOSTCXX), not whichever g++ is first on PATH",
    ),
    # -- torchvision's optional parts: setup.py reads TORCHVISION_USE_<NAME> and quietly drops a part whose
    # library it cannot find, so each is set, 1 or 0, from the recipe's [torchvision.features] -----------
    EnvVar("TORCHVISION_USE_PNG", VISION, lambda c: _bool(c.recipe.vision.png), "torchvision.features.png"),
    EnvVar(
        "TORCHVISION_USE_JPEG", VISION, lambda c: _bool(c.recipe.vision.jpeg), "torchvision.features.jpeg"
    ),
    EnvVar(
        "TORCHVISION_USE_WEBP", VISION, lambda c: _bool(c.recipe.vision.webp), "torchvision.features.webp"
    ),
    EnvVar(
        "TORCHVISION_USE_NVJPEG",
        VISION,
        lambda c: _bool(c.recipe.vision.nvjpeg),
        "torchvision.features.nvjpeg (libnvjpeg from the CUDA toolkit)",
    ),
    EnvVar(
        "TORCHVISION_USE_VIDEO_CODEC",
        VISION,
        lambda c: _bool(c.recipe.vision.video_codec),
        "torchvision.features.video_codec (GPU video decoder)",
    ),
    EnvVar(
        "TORCHVISION_USE_FFMPEG",
        VISION,
        lambda c: _bool(c.recipe.vision.ffmpeg),
        "torchvision.features.ffmpeg (CPU video decoder)",
    ),
    # setup.py reads these two (split at os.pathsep) where it looks for the parts' headers and libraries;
    # the caller's are removed with every TORCHVISION_* variable, so only the recipe sets them
    EnvVar(
        "TORCHVISION_INCLUDE",
        VISION,
        lambda c: os.pathsep.join(c.recipe.vision.include_dirs) or None,
        "torchvision.include_dirs: searched first for the codecs' headers",
    ),
    EnvVar(
        "TORCHVISION_LIBRARY",
        VISION,
        lambda c: os.pathsep.join(c.recipe.vision.library_dirs) or None,
        "torchvision.library_dirs: the codecs' libraries are linked from there",
    ),
    # -- BLAS and MAGMA -----------------------------------------------------------------------------------
    EnvVar(
        "BLAS",
        TORCH,
        lambda c: blas_kind(c.recipe.blas.kind)["cmake"],
        "BLAS library; the configure summary reports USE_MKL from it (USE_MKL is not an option)",
    ),
    EnvVar(
        "CMAKE_INCLUDE_PATH",
        TORCH,
        lambda c: str(c.paths.venv / "include") if c.recipe.blas.kind == "mkl" else None,
        "mkl-include's headers, pip-installed into the build venv",
    ),
    EnvVar(
        "CMAKE_LIBRARY_PATH",
        TORCH,
        lambda c: str(c.paths.venv / "lib") if c.recipe.blas.kind == "mkl" else None,
        "mkl-static's libraries, pip-installed into the build venv",
    ),
    EnvVar(
        "USE_MAGMA", TORCH, lambda c: _bool(c.recipe.magma is not None) if c.cuda else None, "MAGMA asked for"
    ),
    EnvVar(
        "MAGMA_HOME",
        TORCH,
        lambda c: "/usr/local/magma" if c.recipe.magma is not None else None,
        "where scripts/install_magma.sh installs the pinned MAGMA",
    ),
    # -- versions -----------------------------------------------------------------------------------------
    EnvVar(
        "PYTORCH_BUILD_VERSION",
        TORCH,
        lambda c: c.recipe.torch_build_version,
        "the wheel's exact version (else version.txt + git sha)",
    ),
    EnvVar(
        "PYTORCH_BUILD_NUMBER",
        TORCH,
        lambda c: str(c.recipe.build.pytorch_build_number or 0),
        "> 1 appends .postN to PYTORCH_BUILD_VERSION (Recipe.torch_wheel_version says so too)",
    ),
    EnvVar(
        "BUILD_VERSION",
        VISION,
        lambda c: c.recipe.torchvision_wheel_version,
        "torchvision's exact version (else version.txt + git sha)",
    ),
    EnvVar(
        "PYTORCH_VERSION",
        VISION,
        lambda c: c.torch_wheel_version,
        "pins torchvision's torch requirement to the torch built here (or given with --torch)",
    ),
    # -- platform (data/compat.toml [platform.*] build_env) ------------------------------------------------
    EnvVar(
        "CMAKE_SHARED_LINKER_FLAGS",
        TORCH,
        _platform_env("CMAKE_SHARED_LINKER_FLAGS"),
        "aarch64: 64 KiB max page size, so the libraries load on 64K-page kernels (upstream's aarch64 build)",
    ),
    EnvVar(
        "USE_PRIORITIZED_TEXT_FOR_LD",
        TORCH,
        _platform_env("USE_PRIORITIZED_TEXT_FOR_LD"),
        "aarch64: hot text first through a linker script, as upstream's aarch64 build sets it",
    ),
    # -- build type and parallelism -----------------------------------------------------------------------
    EnvVar("CMAKE_BUILD_TYPE", TORCH, lambda c: c.recipe.build.type, "build type"),
    EnvVar("DEBUG", BOTH, _build_type_flag("DEBUG"), "Debug build"),
    EnvVar("REL_WITH_DEB_INFO", TORCH, _build_type_flag("REL_WITH_DEB_INFO"), "RelWithDebInfo build"),
    EnvVar("BUILD_TEST", TORCH, lambda c: "0", "wheels only: C++ tests double the build time"),
    EnvVar("INSTALL_TEST", TORCH, lambda c: "0", "no test binaries in the wheel"),
    EnvVar("CMAKE_GENERATOR", TORCH, lambda c: "Ninja", "ninja's [n/N] progress; USE_NINJA is gone in 2.14"),
    EnvVar("MAX_JOBS", BOTH, lambda c: str(c.jobs), "from cores and memory (torchkiln.plan.jobs)"),
    EnvVar(
        "CMAKE_BUILD_PARALLEL_LEVEL",
        TORCH,
        lambda c: str(c.jobs),
        "what scikit-build-core (release/2.14+) reads instead of MAX_JOBS",
    ),
)


def project_env(project: str, ctx: EnvInputs) -> dict[str, str]:
    """The variables torchkiln sets for ``project``'s build: the table, then the recipe's flags."""
    env: dict[str, str] = {}
    for row in ENV_TABLE:
        if project in row.projects:
            value = row.value(ctx)
            if value is not None:
                env[row.name] = value
    if project == "torch":
        env.update(ctx.recipe.build.flags)
    return env
