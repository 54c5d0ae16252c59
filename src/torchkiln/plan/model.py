"""What a build plan is: its steps, sources and paths, as plain frozen data.

:func:`torchkiln.plan.make.make_plan` fills it; ``torchkiln plan`` prints it; the build loop
(:mod:`torchkiln.build.loop`) executes exactly it. Each :class:`Step` has a **kind** (fetch, env, compile,
package, checks, publish), which decides what the builder does around it (:mod:`torchkiln.build.kinds`), and
declares as plain data what it leaves behind and reads: nothing downstream looks at a step's name.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from torchkiln.artifacts.manifest import Jobs
from torchkiln.cache import CacheConfig
from torchkiln.distributed.spec import ClusterSpec
from torchkiln.recipe.model import Recipe

from .jobs import Resources

PROJECTS = ("torch", "torchvision")
CHECKOUT_DIRS = {"torch": "pytorch", "torchvision": "vision"}
# project -> the projects whose steps it builds on (a changed torch rebuilds torchvision, not the reverse).
DEPENDS: dict[str, tuple[str, ...]] = {"torch": (), "torchvision": ("torch",)}

# How often a compile step resumes with fewer jobs after compiles died for memory, unless told: halving
# MAX_JOBS three times takes 16 jobs to 2, and a unit that dies when compiled alone stops the build sooner.
MEMORY_RETRIES = 3

Kind = Literal["fetch", "env", "compile", "package", "checks", "publish"]


@dataclass(frozen=True)
class Paths:
    workdir: Path
    dist: Path
    # The Python these paths are for in a build for several Pythons (python.versions): "" for the first
    # Python, whose paths are a one-Python build's, else the Python ("3.12"): its venvs, constraints and
    # wheelhouse sit beside the first's with "-3.12" after their names. The sources and logs are shared.
    python: str = ""

    def for_python(self, python: str) -> Paths:
        """The paths of one Python of a several-Python build (``""``: the first's)."""
        return replace(self, python=python)

    @property
    def _tag(self) -> str:
        return f"-{self.python}" if self.python else ""

    @property
    def src(self) -> Path:
        return self.workdir / "src"

    @property
    def venv(self) -> Path:
        return self.workdir / f"venv{self._tag}"

    @property
    def venv_python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    @property
    def wheelhouse(self) -> Path:
        """Where wheels are built before they are moved atomically into dist/."""
        return self.workdir / f"wheelhouse{self._tag}"

    @property
    def launchers(self) -> Path:
        """Compiler names that run the cache tool (torchkiln.cache.masquerade), for torchvision's compiles
        against a torch whose cpp_extension puts no launcher in front by itself."""
        return self.workdir / f"launchers{self._tag}"

    @property
    def constraints(self) -> Path:
        """The build env's resolution as pip constraints: written by build-env:deps, read by every later
        pip call (torchkiln.build.buildreqs)."""
        return self.workdir / f"constraints{self._tag}.txt"

    @property
    def check_venv(self) -> Path:
        return self.workdir / f"check-venv{self._tag}"

    @property
    def warm_check_venv(self) -> Path:
        """Where the check venv is cloned while the compile runs (torchkiln.build.warmcheck)."""
        return self.workdir / f"check-venv{self._tag}.warm"

    def parked(self, python: str, project: str) -> Path:
        """Where a several-Python build keeps ``project``'s in-tree build directory of ``python`` while another
        Python's is in the tree (torchkiln.build.pythons): under the work directory, so under the cache's
        basedir."""
        return self.workdir / "builds" / python / project


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

    ``kind`` decides the behaviour around the command (:data:`torchkiln.build.kinds.KINDS`); the fields after
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
    # The venv the step makes or changes: its result is kept in the environment store (torchkiln.build.envstore)
    # by its content, and a later step on the same venv runs again whenever this one ran.
    venv: str | None = None
    note: str = ""  # what an in-process step (no argv) does, for the plan
    # A build for several Pythons (python.versions): the Python this step is for ("" in a one-Python build),
    # and, for a compile step, where each Python's in-tree build directories are parked while another
    # Python's are in the tree (torchkiln.build.pythons; "" when not parked).
    python: str = ""
    parked: str = ""
    # torchvision's compile: the directory on its PYTHONPATH where the build venv's torch is linked before it
    # runs, so torch.utils.cpp_extension puts torch's headers at one path for every Python ("": none).
    torch_site: str = ""
    # The venv this step's venv starts as a clone of (the check venv: the build venv's): its content is an
    # input of the step's environment-store key ("": none).
    clones: str = ""
    # Whether the venv is kept in the environment store after this step (False: the next step on the venv,
    # keyed by the same inputs and always run right after it, is kept instead; its entry serves both).
    stored: bool = True

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
    jobs: Jobs
    resources: Resources
    frontend: str
    cache: CacheConfig
    projects: tuple[str, ...]
    cluster: ClusterSpec | None = None  # distributed compiles (sccache-dist); the token is read at run time
    # What the user chose to differ from the recipe (--accept-source-version, --torch): the build records
    # each in the manifest's warnings.
    notes: tuple[str, ...] = ()
    # Where venvs are kept by their content and shared between work directories (None: not kept).
    env_store: Path | None = None
    # How often a compile step resumes with fewer jobs after compiles died for memory (torchkiln.build.memory):
    # --memory-retries, else the recipe's build.memory_retries, else MEMORY_RETRIES.
    memory_retries: int = MEMORY_RETRIES
    # --torch's value as pip installs it (a wheel path or a requirement), None when the build installs the
    # recipe's own torch build: what tells the two apart (the same text, torch==2.13.0+cpu, can be either). Recorded for `torchkiln reproduce`.
    given_torch: str | None = None

    def env_for(self, project: str) -> dict[str, str]:
        """The env of the project's compile step (what its build reads, without the secrets)."""
        return next(s.shown_env for s in self.steps if s.kind == "compile" and s.project == project)

    def source(self, project: str) -> Source:
        return next(s for s in self.sources if s.name == project)

    def dependencies(self, index: int) -> list[int]:
        """The earlier steps whose results step ``index`` builds on: a shared step ("" project) on all of
        them, a project's step on the shared steps, its own and those of the projects in DEPENDS. In a build
        for several Pythons, only those of its own Python and those of none (the fetches): another Python's
        rebuild does not make this Python's steps run again."""
        step = self.steps[index]
        related = {"", step.project, *DEPENDS.get(step.project, ())}
        return [
            i
            for i in range(index)
            if (step.project == "" or self.steps[i].project in related)
            and self.steps[i].python in ("", step.python)
        ]

    def venv_steps(self, venv: str) -> list[str]:
        """The steps that make or change ``venv``, in order (what the environment store chains)."""
        return [s.name for s in self.steps if s.venv == venv]

    def wheel_steps(self) -> dict[str, Step]:
        """Per project, the step whose wheels are published: the last one of the project that makes wheels
        (of the first Python, in a build for several: :meth:`published_steps` has every Python's)."""
        first = ("", self.recipe.python)
        return {
            project: step for (project, python), step in self.published_steps().items() if python in first
        }

    def published_steps(self) -> dict[tuple[str, str], Step]:
        """Per project and Python (the step's, ``""`` in a one-Python build), the step whose wheels are
        published: the last one of them that makes wheels."""
        found: dict[tuple[str, str], Step] = {}
        for step in self.steps:
            if step.wheels is not None:
                found[(step.project, step.python)] = step
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
                "pythons": list(r.python_versions),
                "accelerator": r.accelerator.kind,
                "cuda": str(r.accelerator.cuda) if r.accelerator.cuda else None,
                "arch_list": list(r.accelerator.arch_list),
            },
            "projects": list(self.projects),
            "notes": list(self.notes),
            "frontend": {"torch": self.frontend, "torchvision": "setup.py"},
            "jobs": {"value": self.jobs.value, "source": self.jobs.source, "reason": self.jobs.reason},
            "memory_retries": self.memory_retries,
            "resources": {
                "cpus": self.resources.cpus,
                "memory_bytes": self.resources.memory_bytes,
                "memory_source": self.resources.memory_source,
            },
            "cache": {"kind": self.cache.kind, "dir": str(self.cache.dir)},
            "env_store": str(self.env_store) if self.env_store else None,
            # the plan's key keeps its name from before issue 48 (records are read by older tools)
            "dist": self.cluster.to_dict() if self.cluster else None,
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
