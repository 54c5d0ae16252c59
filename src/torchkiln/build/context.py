"""What a build is given and what it accumulates, kept apart.

:class:`BuildSetup` is fixed for the build (the plan, the options, the environment, the display, the state
file, the compiler cache session, the sandboxing, this run's log directory, the watch over the trees):
frozen. :class:`BuildRecord` is what the build's steps found (their records, the warnings, the post-build
checks' verdicts, the wheels' portability, what makes cache misses likely): append-only, read by the steps
after them and by publish.
:mod:`torchkiln.build.loop` makes one of each per build; each step's run
(:class:`~torchkiln.build.stepkind.StepRun`) holds both and keeps what it learns itself, so two builds in one
process share nothing (issue 48).
"""

from __future__ import annotations

import datetime as dt
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from torchkiln.artifacts.manifest import Checks, MemoryRetry, StepRecord
from torchkiln.artifacts.portability import Portability
from torchkiln.errors import space_on
from torchkiln.plan.model import Plan, Step
from torchkiln.printing import Console
from torchkiln.process.logs import first_error, log_name, start_run_logs, tail
from torchkiln.process.secrets import take

from .cachesession import CompilerCache
from .display import Display
from .envstore import EnvStore
from .fingerprint import State
from .progress import format_duration
from .sandbox import Isolating
from .treewatch import TreeWatch

if TYPE_CHECKING:  # the signing machinery is imported only by a build given a key
    from torchkiln.artifacts.signing import PrivateKey

TAIL_LINES = 25


@dataclass(frozen=True)
class Options:
    force: bool = False
    skip_postcheck: bool = False
    min_hit_rate: float | None = None
    # Build and publish a fetched checkout that differs from its pinned ref (a warning, recorded).
    allow_dirty: bool = False
    # The key the publish step signs the provenance statement with (None: no statement); never shown.
    sign_key: PrivateKey | None = field(default=None, repr=False)
    # Files a secret was read from before the build (the signing key's): no build step sees them.
    secret_files: tuple[str, ...] = ()
    # Build steps in a sandbox where the host can (build.sandbox); False: never (--no-sandbox, recorded).
    isolation: bool = True
    # Sign a build whose steps run without a sandbox (--allow-unisolated; refused before the first step else).
    allow_unisolated: bool = False
    # Seconds the command spent before the build, by part ("plan", "preflight"): the manifest says them.
    before: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "before", MappingProxyType(dict(self.before)))


@dataclass(frozen=True)
class Published:
    wheels: list[Path]
    manifest: Path
    lock: Path
    sboms: list[Path] = field(default_factory=list)
    provenance: Path | None = None  # the signed statement, when the build was given a key


class RunLogs:
    """This run's log directory (:func:`torchkiln.process.logs.start_run_logs`), made when its first step
    runs: a run that changed nothing makes none."""

    def __init__(self, logs: Path, started: dt.datetime) -> None:
        self._logs, self._stamp = logs, started.strftime("%Y%m%dT%H%M%SZ")
        self._run: Path | None = None
        self._lock = threading.Lock()

    def step_log(self, step: Step) -> Path:
        """Where a step that runs now writes its log."""
        with self._lock:
            if self._run is None:
                self._run = start_run_logs(self._logs, self._stamp)
            return self._run / log_name(step.name)


@dataclass(frozen=True)
class BuildSetup:
    """What is fixed for one build: what every step's run reads and nothing writes (the objects it holds
    keep what they manage: the state file its records, the cache its session, the sandboxing its probe)."""

    plan: Plan
    options: Options
    # the caller's environment without the variables secrets come from (the cache holds those)
    environ: Mapping[str, str]
    state: State
    display: Display
    console: Console
    started: dt.datetime
    cache: CompilerCache
    isolating: Isolating
    logs: RunLogs
    trees: TreeWatch  # no build step changes what a tree tracks (torchkiln.build.treewatch)
    env_store: EnvStore | None = None  # venvs kept by their content (torchkiln.build.envstore)

    @classmethod
    def make(
        cls,
        plan: Plan,
        options: Options,
        environ: Mapping[str, str],
        state: State,
        display: Display,
        started: dt.datetime | None = None,
    ) -> BuildSetup:
        """The setup of a build of ``plan``: the variables secrets are read from (the cache's
        credentials_env, the cluster's token) are taken out of ``environ``, so that no step's process sees
        them; only the cache session, its server and broker, the preflight and the client config read them."""
        environ = dict(environ)
        names = [plan.cache.credentials_env]
        if plan.cluster is not None:
            names.append(plan.cluster.credentials_env)
        held = take(environ, names)
        started = started or dt.datetime.now(dt.timezone.utc)
        return cls(
            plan=plan,
            options=options,
            environ=MappingProxyType(environ),
            state=state,
            display=display,
            console=display.console,
            started=started,
            cache=CompilerCache(plan, held),
            isolating=Isolating(),
            logs=RunLogs(plan.paths.logs, started),
            env_store=EnvStore(plan.env_store) if plan.env_store is not None else None,
            trees=TreeWatch(plan),
        )

    def step_log(self, step: Step) -> Path:
        return self.logs.step_log(step)

    def redact(self, text: str) -> str:
        return self.cache.redact(text)


class BuildRecord:
    """What one build accumulates as its steps run, read by the steps after them (which ran) and by publish.
    Append-only: each ``add_*`` adds, nothing replaces or removes what was added."""

    def __init__(self, show: Callable[[str], None] | None = None) -> None:
        self._show = show  # a warning is shown when it is added (the build's display)
        self._steps: list[StepRecord] = []
        self._warnings: list[str] = []
        self._checks: dict[str, Checks] = {}  # Python ("" the first) -> its post-build check's verdict
        self._portability: dict[str, Portability] = {}
        self._causes: list[str] = []

    def add_step(self, record: StepRecord) -> None:
        self._steps.append(record)

    @property
    def steps(self) -> tuple[StepRecord, ...]:
        return tuple(self._steps)

    def warn(self, text: str) -> None:
        """A warning the manifest keeps, shown now."""
        self._warnings.append(text)
        if self._show is not None:
            self._show(text)

    def add_warning(self, text: str) -> None:
        """A warning the manifest keeps, not shown (what was said on the console already)."""
        self._warnings.append(text)

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(self._warnings)

    def add_checks(self, python: str, checks: Checks) -> None:
        """The post-build check's verdict on the wheels of ``python`` ("": the first, or only, Python)."""
        if python in self._checks:
            raise ValueError(f"the post-build check of Python {python or 'first'} was recorded already")
        self._checks[python] = checks

    @property
    def checks(self) -> Checks | None:
        """The first Python's verdict (a one-Python build's)."""
        return self._checks.get("")

    @property
    def python_checks(self) -> Mapping[str, Checks]:
        """Each later Python's verdict, by Python (python.versions)."""
        return MappingProxyType({k: v for k, v in self._checks.items() if k})

    def add_portability(self, wheel: str, record: Portability) -> None:
        """A wheel's portability record, as the post-build check judged it (torchkiln.build.portable)."""
        if self._portability.get(wheel, record) != record:
            raise ValueError(f"{wheel}: a second, different portability record")
        self._portability[wheel] = record

    @property
    def portability(self) -> Mapping[str, Portability]:
        return MappingProxyType(self._portability)

    def add_cache_causes(self, causes: list[str]) -> None:
        """What a compile saw that makes cache misses likely (named when the build misses)."""
        self._causes += causes

    @property
    def cache_causes(self) -> tuple[str, ...]:
        return tuple(self._causes)


@dataclass(frozen=True)
class Ran:
    """A step's command ran to success."""

    seconds: float
    log: Path | None
    tail: list[str] = field(default_factory=list)
    phases: dict[str, float] | None = None
    status: str = "ran"
    # compile steps: each resumption after compiles died for memory (torchkiln.build.memory)
    memory_retries: list[MemoryRetry] = field(default_factory=list)
    # outputs the builder worked out while the command ran (the check's portability: build.wheelkinds)
    early: dict[str, Any] = field(default_factory=dict)
    # the environment store's entry for the step's venv, begun while it ran (the check's): the loop keeps it
    staged: Path | None = None
    published: Published | None = None  # the publish step's: what reached dist/


_OUT_OF_SPACE = re.compile(r"No space left on device|Disk quota exceeded")
_ABSOLUTE = re.compile(r"(/[^\s'\":]+)")


def failure_message(name: str, code: int | None, seconds: float, log: Path, where: str | None = None) -> str:
    """What a failed run shows: how it ended, its first error, the last lines of its log, the log's path.
    A full disk says so on the first line, with the filesystem (the path the error names, else ``where``
    the run writes), its free space, and that a rerun continues, as every other out-of-space path does."""
    error = first_error(log)
    lines = [f"{name} failed (exit {code}) after {format_duration(seconds)}{_out_of_space(error, where)}"]
    if error:
        lines.append(f"first error: {error}")
    lines.append("last lines of the log:")
    lines += [f"  {line}" for line in tail(log, TAIL_LINES)]
    lines.append(f"full log: {log}")
    return "\n".join(lines)


def _out_of_space(error: str | None, where: str | None) -> str:
    if not error or not _OUT_OF_SPACE.search(error):
        return ""
    named = _ABSOLUTE.findall(error)  # the last path: a copy's target ("source -> target")
    place = named[-1] if named else where
    space = space_on(Path(place)) if place else "a filesystem is full"
    return f": out of space: {space}; free space there (df -h) and run again: completed steps are kept, a rerun continues"
