"""What a step kind may use and leave for the steps after it: the plan, the run's options and state, the
display, the compiler cache session, and what this run has found so far.

:mod:`torchkiln.steps` (the kinds) and :mod:`torchkiln.publish` (the last step) read and write it;
:mod:`torchkiln.build` makes one per run. Per-build figures a later issue adds (cache statistics per step,
timings per run) belong here.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from .cache import CacheSession, CacheStats, open_session
from .display import Display
from .environ import compose
from .errors import TorchkilnError
from .fingerprint import State
from .logs import log_name, start_run_logs
from .manifest import Checks, StepRecord
from .plan import Plan, Step


@dataclass
class Options:
    force: bool = False
    skip_checks: bool = False
    min_hit_rate: float | None = None


@dataclass
class Published:
    wheels: list[Path]
    manifest: Path
    lock: Path


@dataclass
class Context:
    """What a step kind may use and leave for later steps: the plan, the run's options and state, the
    display, and what this run found so far."""

    plan: Plan
    options: Options
    environ: dict[str, str]
    state: State
    display: Display
    console: Console
    started: dt.datetime
    records: list[StepRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    cache: CacheSession | None = None
    cache_stats: CacheStats | None = None  # this run's, once the session closed
    checks: Checks | None = None
    published: Published | None = None
    # What the compile steps saw that makes cache misses likely (a tree outside the basedir, a changed
    # compiler): named by --min-cache-hit-rate's message when the build misses.
    cache_causes: list[str] = field(default_factory=list)
    run_logs: Path | None = None  # this run's log directory, made when its first step runs

    def step_log(self, step: Step) -> Path:
        """Where a step that runs now writes its log: this run's directory (torchkiln.logs.start_run_logs)."""
        if self.run_logs is None:
            stamp = self.started.strftime("%Y%m%dT%H%M%SZ")
            self.run_logs = start_run_logs(self.plan.paths.logs, stamp)
        return self.run_logs / log_name(step.name)

    def warn(self, text: str) -> None:
        self.warnings.append(text)
        self.display.warn(text)

    def redact(self, text: str) -> str:
        return self.cache.redact(text) if self.cache is not None else text

    def open_cache(self, step: Step) -> CacheSession:
        """Before the first compile that runs: tool present, remote usable (else one warning), stats zeroed."""
        if self.cache is None:
            tool_environ = compose(self.environ, step.env, path_prepend=step.path_prepend)
            self.cache = open_session(self.plan.cache, tool_environ)
            for warning in self.cache.warnings:
                self.warn(warning)
        return self.cache

    def close_cache(self) -> None:
        """This run's statistics; stops what the cache tool started for the build (its sccache server)."""
        if self.cache is None or self.cache.closed:
            return
        try:
            stats = self.cache.close()
        except TorchkilnError as exc:
            self.warnings.append(f"compiler cache statistics unavailable: {exc}")
            return
        self.cache_stats = stats
        if stats is not None:
            self.console.print(f"  compiler cache: {stats.summary()}")


@dataclass(frozen=True)
class Ran:
    """A step's command ran to success."""

    seconds: float
    log: Path | None
    tail: list[str] = field(default_factory=list)
    phases: dict[str, float] | None = None
    status: str = "ran"
