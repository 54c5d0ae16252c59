"""What a step kind may use and leave for the steps after it: the plan, the run's options and state, the
display, the compiler cache session, and what this run has found so far.

:mod:`torchkiln.build.kinds` (the kinds) and :mod:`torchkiln.build.publish` (the last step) read and write it;
:mod:`torchkiln.build.loop` makes one per run. Per-build figures a later issue adds (cache statistics per step,
timings per run) belong here.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from torchkiln.artifacts.manifest import Checks, MemoryRetry, StepRecord
from torchkiln.artifacts.portability import Portability
from torchkiln.cache import CacheSession, CacheStats, open_session
from torchkiln.distributed.stats import DistStats
from torchkiln.errors import TorchkilnError, space_on
from torchkiln.plan.model import Plan, Step
from torchkiln.process.environ import compose
from torchkiln.process.logs import first_error, log_name, start_run_logs, tail

from .display import Display
from .envstore import EnvStore
from .fingerprint import State
from .progress import format_duration
from .sandbox import Isolating, server_sandbox
from .warmcheck import Warming

if TYPE_CHECKING:  # the signing machinery is imported only by a build given a key
    from torchkiln.artifacts.signing import PrivateKey
    from torchkiln.distributed.client import PreparedDist  # the client only by a build with a scheduler

TAIL_LINES = 25


@dataclass
class Options:
    force: bool = False
    skip_checks: bool = False
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
    before: dict[str, float] = field(default_factory=dict)


@dataclass
class Published:
    wheels: list[Path]
    manifest: Path
    lock: Path
    sboms: list[Path] = field(default_factory=list)
    provenance: Path | None = None  # the signed statement, when the build was given a key


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
    dist: PreparedDist | None = None  # distributed compiles, once the cache session opened
    dist_env: dict[str, str] = field(default_factory=dict)  # compile steps' run-time layer for them
    # What the sccache server alone starts with for them: SCCACHE_CONF, the client config holding the token.
    dist_server_env: dict[str, str] = field(default_factory=dict)
    dist_stats: DistStats | None = None  # where this run's compiles ran, once the session closed
    # The variables secrets are read from (the cache's credentials_env, the cluster's token), taken out of
    # ``environ`` so that no step's process sees them; only the cache session, its server and broker, the
    # preflight and the client config file read them.
    held: dict[str, str] = field(default_factory=dict, repr=False)
    # venvs cloned from the store and unchanged since, and check venvs cloned while a compile runs
    warming: Warming = field(default_factory=Warming)
    # the environment store's entries begun while their step ran (the check's venv), by step: keep commits them
    staged: dict[str, Path] = field(default_factory=dict)
    isolating: Isolating = field(default_factory=Isolating)  # the build steps' sandboxes (build.sandbox)

    def __post_init__(self) -> None:
        names = [self.plan.cache.credentials_env]
        if self.plan.dist is not None:
            names.append(self.plan.dist.credentials_env)
        for name in names:
            if name and name in self.environ:
                self.held[name] = self.environ.pop(name)

    checks: Checks | None = None
    # A build for several Pythons (python.versions): each later Python's post-build check, by Python
    # (``checks`` is the first Python's, as in a one-Python build).
    python_checks: dict[str, Checks] = field(default_factory=dict)
    # Wheel file name -> its portability record, judged by the post-build check (torchkiln.build.portable)
    portability: dict[str, Portability] = field(default_factory=dict)
    published: Published | None = None
    # What the compile steps saw that makes cache misses likely (a tree outside the basedir, a changed
    # compiler): named by --min-cache-hit-rate's message when the build misses.
    cache_causes: list[str] = field(default_factory=list)
    run_logs: Path | None = None  # this run's log directory, made when its first step runs
    env_store: EnvStore | None = None  # venvs kept by their content (torchkiln.build.envstore)
    env_keys: dict[str, str] = field(default_factory=dict)  # step -> its key in the store, this run
    # venvs that a step made or changed in this run: the later steps on them run (or are reused) again
    remade_venvs: set[str] = field(default_factory=set)
    # venv -> steps reused without their clone (the next step's entry replaced it), recorded with that step
    deferred_records: dict[str, list[tuple[str, dict[str, Any]]]] = field(default_factory=dict)
    # step -> its inputs, taken early by the step before it (whether its entry replaces that one's venv)
    lookahead_inputs: dict[str, dict[str, str]] = field(default_factory=dict)

    def step_log(self, step: Step) -> Path:
        """Where a step that runs now writes its log: this run's directory (torchkiln.process.logs.start_run_logs)."""
        if self.run_logs is None:
            stamp = self.started.strftime("%Y%m%dT%H%M%SZ")
            self.run_logs = start_run_logs(self.plan.paths.logs, stamp)
        return self.run_logs / log_name(step.name)

    def warn(self, text: str) -> None:
        self.warnings.append(text)
        self.display.warn(text)

    def redact(self, text: str) -> str:
        if self.dist is not None:
            text = self.dist.redact(text)
        return self.cache.redact(text) if self.cache is not None else text

    def open_cache(self, step: Step) -> CacheSession:
        """Before the first compile that runs: tool present, remote usable (else one warning), stats zeroed.

        With distributed compiles the scheduler is checked first (unreachable or refusing the token: one
        warning, compiles run locally) and the sccache server starts with the client config (SCCACHE_CONF),
        a private file that holds the token and is removed when the server stops."""
        if self.cache is None:
            tool_environ = compose(self.environ, step.env, path_prepend=step.path_prepend)
            self._prepare_dist(tool_environ)
            cache_secret = {k: v for k, v in self.held.items() if k == self.plan.cache.credentials_env}
            self.cache = open_session(
                self.plan.cache,
                {**tool_environ, **cache_secret},  # the session reads it; its tool does not get the variable
                extra_env=self.dist_server_env,
                sandbox=server_sandbox(self),
            )
            if self.dist is not None and self.dist.conf_path is not None:
                # sccache read its client config (the token) once, when its server started: emptied now, the
                # token lives in that server's memory only, not in a file the compiles it runs could read
                os.truncate(self.dist.conf_path, 0)
            for warning in self.cache.warnings:
                self.warn(warning)
        return self.cache

    def _prepare_dist(self, environ: dict[str, str]) -> None:
        spec = self.plan.dist
        if spec is None:
            return
        from torchkiln.distributed.client import (  # noqa: PLC0415 - only a build with a scheduler
            default_toolchain_dir,
            dist_jobs,
            prepare_client,
        )

        run_dir = Path(tempfile.mkdtemp(prefix="torchkiln-dist-"))  # 0700: the token lands in it
        self.dist = prepare_client(
            spec,
            {**environ, **self.held},
            run_dir=run_dir,
            toolchain_dir=default_toolchain_dir(self.plan.cache.dir),
        )
        for warning in self.dist.warnings:
            self.warn(self.dist.redact(warning))
        if self.dist.spec is None:  # the preflight failed: local compiles
            shutil.rmtree(run_dir, ignore_errors=True)
            return
        self.dist_server_env = dict(self.dist.env)  # the server's alone: the compiles are its clients
        if self.plan.jobs.source == "auto" and self.dist.status is not None:
            # Remote compiles cost this machine preprocessing only: one job per core of the cluster too.
            jobs = str(dist_jobs(self.plan.jobs.value, self.dist.status))
            self.dist_env.update({"MAX_JOBS": jobs, "CMAKE_BUILD_PARALLEL_LEVEL": jobs})
            self.display.note(
                f"distributed compiles: {self.dist.status.num_servers} build servers, "
                f"{self.dist.status.num_cpus} cores at {spec.scheduler_url}; MAX_JOBS={jobs}"
            )

    def close_cache(self) -> None:
        """This run's statistics; stops what the cache tool started for the build (its sccache server)."""
        if self.cache is None or self.cache.closed:
            return
        try:
            stats = self.cache.close()
        except TorchkilnError as exc:
            self.warnings.append(f"compiler cache statistics unavailable: {exc}")
            return
        finally:
            if self.dist is not None:
                self._finish_dist()
        self.cache_stats = stats
        if stats is not None:
            self.console.print(f"  compiler cache: {stats.summary()}")
        if stats is not None and self.dist is not None and self.dist.spec is not None:
            self.dist_stats = stats.dist  # read with the cache's counters, before the server stopped
        if self.dist_stats is not None:
            self.console.print(f"  {self.dist_stats.summary()}")
            fallback = self.dist_stats.fallback_warning()
            if fallback:
                self.warn(fallback)

    def _finish_dist(self) -> None:
        """The client config (and the token in it) removed once the server that read it has stopped."""
        assert self.dist is not None
        from torchkiln.distributed.client import finish_client  # noqa: PLC0415 - see _prepare_dist

        finish_client(self.dist)
        if self.dist.conf_path is not None:
            shutil.rmtree(self.dist.conf_path.parent, ignore_errors=True)


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
    # outputs the builder worked out while the command ran (the check's portability: build.kinds)
    early: dict[str, Any] = field(default_factory=dict)


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
