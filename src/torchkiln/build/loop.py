"""Run a :class:`~torchkiln.plan.model.Plan`: the steps in order, each with what its kind does around it.

The plan says *what* runs; :mod:`torchkiln.build.kinds` says what each kind of step needs around its command;
this module is the loop between them and what a long build needs around the loop:

- one build per work directory at a time (a lock file), its layout repaired and dist/ checked writable before
  the first step (:mod:`torchkiln.build.workdir`);
- fingerprints (:mod:`torchkiln.build.fingerprint`): an unchanged step is skipped, so a rerun with nothing changed
  finishes in seconds; ``force`` runs the compile and everything after it again (checkouts and
  environments stay keyed by their content; what a step's last run recorded stays readable to it until it
  succeeds: the in-tree outputs of a compile); a step that makes wheels is known to the steps after
  it by their content, so an identical rebuilt wheel leaves them alone;
- the environment store (:mod:`torchkiln.build.envstore`): a step that makes or changes a venv and is not
  unchanged here is cloned from the store when another work directory kept the same venv ("reused"), and
  its venv is kept there after it ran; once a venv was made again, the later steps on it run again;
- interrupts: Ctrl-C and SIGTERM stop the running step's whole process group and leave dist/ untouched
  (wheels reach dist/ only in the last step, publish, after everything succeeded).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import os
import signal
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from torchkiln.artifacts.manifest import StepRecord
from torchkiln.errors import BuildFailed, ConfigureMismatch, Interrupted, TorchkilnError, name_path
from torchkiln.files.atomic import clean_partials
from torchkiln.plan.model import Plan, Step
from torchkiln.process import runner

from .context import Context, Options
from .display import Display
from .envstore import EnvStore
from .fingerprint import State, digest, result_identity, step_fingerprint
from .kinds import KINDS, kept_files
from .sandbox import ran_unsandboxed, require_isolation_to_sign, sandboxes
from .treeguard import check_given_trees
from .workdir import STATE_NAME, check_dist, holding_lock, repair_layout

if TYPE_CHECKING:  # the signing machinery is imported only by a build given a key
    from torchkiln.artifacts.signing import PrivateKey

__all__ = [
    "BuildFailed",
    "BuildOptions",
    "BuildResult",
    "ConfigureMismatch",
    "Interrupted",
    "StepRecord",
    "run_build",
]


@dataclass
class BuildOptions:
    force: bool = False
    skip_checks: bool = False
    min_hit_rate: float | None = None
    console: Console | None = None
    environ: Mapping[str, str] | None = None
    allow_dirty: bool = False  # a fetched checkout changed after its fetch is built and published (warned)
    sign_key: PrivateKey | None = field(default=None, repr=False)  # signs dist/<recipe>.intoto.jsonl
    secret_files: tuple[str, ...] = ()  # files secrets were read from (the key's): no build step sees them
    isolation: bool = True  # build steps sandboxed where the host can (False: --no-sandbox, recorded)
    allow_unisolated: bool = (
        False  # sign a build whose steps cannot be sandboxed (else refused: build.sandbox)
    )
    # seconds the command spent before this call, by part ("plan": the recipe read and --torch resolved;
    # "preflight": the host's checks): the manifest's overhead says them beside "publish"
    before: Mapping[str, float] = field(default_factory=dict)


@dataclass
class BuildResult:
    wheels: list[Path]
    manifest: Path
    lock: Path
    steps: list[StepRecord] = field(default_factory=list)
    sboms: list[Path] = field(default_factory=list)
    provenance: Path | None = None  # dist/<recipe>.intoto.jsonl, when the build was given a key

    @property
    def ran(self) -> list[str]:
        return [s.name for s in self.steps if s.status == "ran"]


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C, so one cleanup path handles both."""

    def handler(signum: int, frame: object) -> None:
        error = Interrupted(
            f"torchkiln build: stopped by signal {signal.Signals(signum).name}; dist/ is unchanged"
        )
        error.exit_code = 128 + signum
        raise error

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_steps(ctx: Context) -> None:
    """Each step: skipped when its fingerprint and outputs are unchanged, else reused from the environment
    store or run, recorded and checked."""
    plan = ctx.plan
    fingerprints: dict[str, str] = {}
    for index, step in enumerate(plan.steps):
        kind = KINDS[step.kind]
        if kind.optional and ctx.options.skip_checks:
            fingerprints[step.name] = digest({"skipped": step.name})
            continue
        with _overhead(ctx, step):
            ctx.display.start_step(index + 1, len(plan.steps), step)
            if kind.always_runs:
                ran = kind.execute(step, ctx)
                record = StepRecord(step.name, step.kind, step.project, ran.status, ran.seconds, None)
                ctx.records.append(record)
                ctx.display.end_step(step, ran.status, ran.seconds)
                continue
            fingerprints[step.name] = _one_step(ctx, step, index, fingerprints)


@contextlib.contextmanager
def _overhead(ctx: Context, step: Step) -> Iterator[None]:
    """The step's record gets torchkiln's own time for it: the whole time spent on it, less its command's
    (``duration_s``): what a run spends that no step accounts for is then its start and its end alone."""
    started = time.monotonic()
    try:
        yield
    finally:
        if ctx.records and ctx.records[-1].name == step.name:
            record = ctx.records[-1]
            spent = time.monotonic() - started
            ctx.records[-1] = replace(record, overhead_s=round(max(0.0, spent - record.duration_s), 3))


def _one_step(ctx: Context, step: Step, index: int, fingerprints: Mapping[str, str]) -> str:
    """One step that has a fingerprint: skipped, reused or run; its result identity."""
    plan, kind = ctx.plan, KINDS[step.kind]
    deps = [fingerprints[plan.steps[i].name] for i in plan.dependencies(index)]
    inputs = ctx.lookahead_inputs.pop(step.name, None)
    if inputs is None:
        inputs = kind.inputs(step, ctx)
    fingerprint = step_fingerprint(step.argv, step.shown_env, step.cwd, inputs, deps)
    key = kind.store_key(step, ctx, inputs)
    if key is not None:
        ctx.env_keys[step.name] = key
    forced = ctx.options.force and kind.forced
    identity = None if forced else _unchanged(ctx, step, fingerprint)
    if identity is None:  # it runs or is restored: its earlier record is gone, its venv made again
        ctx.state.forget(step.name)
        if step.venv is not None:
            ctx.remade_venvs.add(step.venv)
        identity = None if forced else _reused(ctx, step, index, fingerprint, key)
        if identity is None:
            return _ran(ctx, step, fingerprint, deps, key)
    ctx.warming.drop(step.venv)  # skipped or reused: a warm clone of its venv is of no use (build.warmcheck)
    return identity


def _unchanged(ctx: Context, step: Step, fingerprint: str) -> str | None:
    """A step whose fingerprint and outputs are unchanged is skipped (its result checked again): its result
    identity; None when it must run."""
    kind, entry = KINDS[step.kind], ctx.state.get(step.name)
    if (
        # a venv an earlier step made again no longer holds what this step put in it
        step.venv in ctx.remade_venvs
        or not entry
        or entry.get("fingerprint") != fingerprint
        or not kind.intact(step, entry, ctx)
        # made without a sandbox: a build that sandboxes makes it again rather than vouch for it
        or (ran_unsandboxed(step, entry.get("outputs") or {}) and sandboxes(ctx))
    ):
        return None
    kind.verify(step, entry, ctx)
    ctx.records.append(StepRecord(step.name, step.kind, step.project, "skipped", 0.0, entry.get("log")))
    ctx.display.end_step(step, "skipped", 0.0)
    return result_identity(fingerprint, entry)


def _reused(ctx: Context, step: Step, index: int, fingerprint: str, key: str | None) -> str | None:
    """A step the environment store holds the result of is restored from it: its result identity; None when
    it must run."""
    kind = KINDS[step.kind]
    restored = kind.reuse(step, ctx, key, functools.partial(_replaced_next, ctx, index))
    if restored is None or (ran_unsandboxed(step, restored.outputs) and sandboxes(ctx)):
        return None
    entry: dict[str, Any] = {"fingerprint": fingerprint, "outputs": restored.outputs, "log": None}
    entry["duration_s"] = restored.seconds
    _record(ctx, step, entry, deferred=not restored.cloned)
    kind.verify(step, entry, ctx)
    ctx.records.append(StepRecord(step.name, step.kind, step.project, "reused", restored.seconds, None))
    ctx.display.end_step(step, "reused", restored.seconds)
    return result_identity(fingerprint, entry)


def _ran(ctx: Context, step: Step, fingerprint: str, deps: list[str], key: str | None) -> str:
    """The step run, recorded, kept in the environment store and checked: its result identity."""
    kind = KINDS[step.kind]
    if step.venv is not None:  # it changes its venv: no longer what the store entry it was cloned from holds
        ctx.warming.changed(step.venv)
    kind.prepare(step, ctx)
    try:
        ran = kind.execute(step, ctx)
    finally:
        ctx.display.stop_live()
    log = str(ran.log) if ran.log else None
    try:
        outputs = kind.outputs(step, ran, ctx)
        settled = kind.settled_inputs(step, ctx, outputs)
        if settled is not None:
            fingerprint = step_fingerprint(step.argv, step.shown_env, step.cwd, settled, deps)
        entry = {"fingerprint": fingerprint, "outputs": outputs, "log": log, "duration_s": ran.seconds}
        _record(ctx, step, entry)
        kind.keep(step, ctx, key, outputs)
    finally:
        EnvStore.discard(ctx.staged.pop(step.name, None))  # staged while it ran, and not kept
    # After recording: what was found stays valid when the check fails, and a fixed recipe only checks again.
    kind.verify(step, entry, ctx)
    ctx.records.append(
        StepRecord(
            step.name,
            step.kind,
            step.project,
            "ran",
            ran.seconds,
            log,
            ran.phases,
            memory_retries=ran.memory_retries,
        )
    )
    ctx.display.end_step(step, "ran", ran.seconds)
    return result_identity(fingerprint, entry)


def _record(ctx: Context, step: Step, entry: dict[str, Any], *, deferred: bool = False) -> None:
    """Record a step as done. A step reused without cloning its venv (the next step's entry replaced it) is
    recorded with the next step that leaves the venv whole: a build that stops between them runs both again."""
    if deferred and step.venv is not None:
        ctx.deferred_records.setdefault(step.venv, []).append((step.name, entry))
        return
    for name, earlier in ctx.deferred_records.pop(step.venv, []) if step.venv is not None else []:
        ctx.state.record(name, earlier)
    ctx.state.record(step.name, entry)


def _replaced_next(ctx: Context, index: int) -> bool:
    """Whether the step after ``index`` is on the same venv and will be reused from the store: then cloning
    this step's venv is wasted (that one replaces it). Its inputs, taken here, are kept for its turn."""
    plan = ctx.plan
    if index + 1 >= len(plan.steps) or ctx.env_store is None:
        return False
    step, following = plan.steps[index], plan.steps[index + 1]
    kind = KINDS[following.kind]
    if following.venv is None or following.venv != step.venv:
        return False
    if (kind.optional and ctx.options.skip_checks) or (ctx.options.force and kind.forced):
        return False
    inputs = kind.inputs(following, ctx)
    ctx.lookahead_inputs[following.name] = inputs
    key = kind.store_key(following, ctx, inputs)
    return key is not None and ctx.env_store.lookup(key, kept_files(following)) is not None


def run_build(plan: Plan, options: BuildOptions | None = None) -> BuildResult:
    """Execute ``plan``; raises BuildFailed / ConfigureMismatch / Interrupted (all TorchkilnError)."""
    options = options or BuildOptions()
    console = options.console or Console(highlight=False)
    display = Display(console)
    paths = plan.paths
    try:
        paths.workdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise name_path(exc, paths.workdir) from None
    check_dist(paths.dist, plan.recipe.name)
    # supervised: nothing this build starts outlives it, also when torchkiln is SIGKILLed
    with holding_lock(paths.workdir), runner.supervised():
        repair_layout(paths.workdir, display.note)
        ctx = Context(
            plan=plan,
            options=Options(
                options.force,
                options.skip_checks,
                options.min_hit_rate,
                options.allow_dirty,
                options.sign_key,
                options.secret_files,
                options.isolation,
                options.allow_unisolated,
                dict(options.before),
            ),
            environ=dict(options.environ if options.environ is not None else os.environ),
            state=State(paths.workdir / STATE_NAME),
            display=display,
            console=console,
            started=dt.datetime.now(dt.timezone.utc),
            env_store=EnvStore(plan.env_store) if plan.env_store is not None else None,
        )
        for name in ctx.state.dropped:
            display.note(f"{ctx.state.path}: the record of {name} is damaged; that step runs again")
        paths.logs.mkdir(parents=True, exist_ok=True)
        for note in plan.notes:  # the user's explicit departures from the recipe: into the manifest
            ctx.warn(note)
        for leftover in clean_partials(paths.dist):
            display.note(f"removed a partial file left by an interrupted build: {leftover}")
        require_isolation_to_sign(ctx)  # a signed build vouches for sandboxed steps (build.sandbox)
        check_given_trees(plan, options.allow_dirty)  # a given tree's links out of it (build.treeguard)
        with _terminate_as_interrupt():
            try:
                try:
                    _run_steps(ctx)
                finally:
                    ctx.warming.finish()  # a warm check venv no step took is removed
                    display.close()  # the final message (or the error) is the last thing shown
                    ctx.close_cache()
            except KeyboardInterrupt:
                raise Interrupted("torchkiln build: interrupted (Ctrl-C); dist/ is unchanged") from None
        published = ctx.published
        if published is None:  # a plan without a publish step (a library caller's subset)
            raise TorchkilnError("the plan has no publish step: nothing reached dist/")
        return BuildResult(
            published.wheels,
            published.manifest,
            published.lock,
            ctx.records,
            published.sboms,
            published.provenance,
        )
