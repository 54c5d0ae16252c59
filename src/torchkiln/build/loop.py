"""Run a :class:`~torchkiln.plan.model.Plan`: the steps in order, each with what its kind does around it.

The plan says *what* runs; :mod:`torchkiln.build.kinds` says what each kind of step needs around its command;
this module is the loop between them and what a long build needs around the loop. For each step the step's
kind starts a run (:class:`~torchkiln.build.stepkind.StepRun`) that takes its inputs, is checked against its
record, prepares, runs and hands back its outputs; the loop makes the fingerprint and the step's record of
them, and adds the record to the build's :class:`~torchkiln.build.context.BuildRecord`. Everything a build
holds is made here, per build: two builds in one process (two threads) share nothing.

- one build per work directory at a time (a lock file), its layout repaired and dist/ checked writable before
  the first step (:mod:`torchkiln.build.workdir`);
- fingerprints (:mod:`torchkiln.build.fingerprint`): an unchanged step is skipped, so a rerun with nothing changed
  finishes in seconds; ``force`` runs the compile and everything after it again (checkouts and
  environments stay keyed by their content; what a step's last run recorded stays readable to it until it
  succeeds: the in-tree outputs of a compile); a step that makes wheels is known to the steps after
  it by their content, so an identical rebuilt wheel leaves them alone;
- the environment store (:mod:`torchkiln.build.envstore`), through the build's
  :class:`~torchkiln.build.venvreuse.VenvReuse`: a step that makes or changes a venv and is not unchanged
  here is cloned from the store when another work directory kept the same venv ("reused"), and its venv is
  kept there after it ran; once a venv was made again, the later steps on it run again;
- interrupts: Ctrl-C and SIGTERM stop the running step's whole process group and leave dist/ untouched
  (wheels reach dist/ only in the last step, publish, after everything succeeded).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchkiln.artifacts.manifest import StepRecord
from torchkiln.errors import BuildFailed, ConfigureMismatch, Interrupted, TorchkilnError, name_path
from torchkiln.files.atomic import clean_partials
from torchkiln.plan.model import Plan
from torchkiln.printing import Console, make_console
from torchkiln.process import runner

from .context import BuildRecord, BuildSetup, Options, Published
from .display import Display
from .envstore import EnvStore
from .fingerprint import State, digest, result_identity, step_fingerprint
from .kinds import KINDS
from .sandbox import ran_unsandboxed, require_isolation_to_sign, sandboxes
from .stepkind import StepRun
from .treeguard import check_given_trees
from .venvreuse import DamagedVenv, VenvReuse
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
    skip_postcheck: bool = False
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

    installed = True
    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (a build of several in one process): leave signals alone
        installed = False
    try:
        yield
    finally:
        if installed:
            signal.signal(signal.SIGTERM, previous)


def _passes(setup: BuildSetup, record: BuildRecord) -> tuple[Published | None, BuildRecord]:
    """The steps (:func:`_run_steps`), and again from the first when a venv a step relies on is found damaged
    and the environment store cannot give it back (:class:`~torchkiln.build.venvreuse.DamagedVenv`): that
    venv's steps forgotten, so they run again; said in one line. What ran in the first pass is recorded as it
    ran. Returns what was published and the build's record (the last pass's)."""
    earlier: dict[str, StepRecord] = {}
    said: set[str] = set()  # each pass drops an entry or makes a venv in it: never the same damage twice
    while True:
        venvs = VenvReuse(setup, record, KINDS)
        try:
            return _run_steps(setup, record, venvs, earlier), record
        except DamagedVenv as found:
            if found.line in said:
                line = f"{found.line} (again, after it was made again in this build)"
                raise BuildFailed(line, step=found.step) from None
            said.add(found.line)
            venvs.finish()  # nothing of this pass still at work on the venv
            venvs.forget(found.venv)
            setup.display.note(f"{found.line}: the steps on {found.venv} run again (the build starts over)")
            earlier |= {r.name: r for r in record.steps if r.status in ("ran", "reused")}
            again = BuildRecord(show=setup.display.warn)
            for warning in record.warnings:
                again.add_warning(warning)
            record = again
        finally:
            venvs.finish()  # a warm check venv no step took is removed


def _run_steps(
    setup: BuildSetup, record: BuildRecord, venvs: VenvReuse, earlier: Mapping[str, StepRecord]
) -> Published | None:
    """Each step: skipped when its fingerprint and outputs are unchanged, else reused from the environment
    store or run, recorded and checked (``earlier``: the records of the steps an earlier pass ran, kept where
    this pass skips them). Returns what the publish step published."""
    plan = setup.plan
    fingerprints: dict[str, str] = {}
    published = None
    for index, step in enumerate(plan.steps):
        kind = KINDS[step.kind]
        if kind.optional and setup.options.skip_postcheck:
            fingerprints[step.name] = digest({"skipped": step.name})
            continue
        started = time.monotonic()
        setup.display.start_step(index + 1, len(plan.steps), step)
        run, inputs = venvs.begin(step)
        if kind.always_runs:
            setup.trees.before(step)  # nothing changed the trees since the last step (build.treewatch)
            ran = run.execute()
            done = StepRecord(step.name, step.kind, step.project, ran.status, ran.seconds, None)
            setup.display.end_step(step, ran.status, ran.seconds)
            published = ran.published or published
        else:
            fingerprints[step.name], done = _one_step(setup, venvs, run, inputs, index, fingerprints)
            if done.status == "skipped" and step.name in earlier:
                record.add_step(earlier[step.name])
                continue
        record.add_step(_with_overhead(done, started))
    return published


def _with_overhead(done: StepRecord, started: float) -> StepRecord:
    """The step's record with torchkiln's own time for it: the whole time spent on it, less its command's
    (``duration_s``): what a run spends that no step accounts for is then its start and its end alone."""
    spent = time.monotonic() - started
    return replace(done, overhead_s=round(max(0.0, spent - done.duration_s), 3))


Done = tuple[str, StepRecord]  # a step's result identity (what the steps after it see of it) and its record


def _one_step(
    setup: BuildSetup,
    venvs: VenvReuse,
    run: StepRun,
    inputs: dict[str, str] | None,
    index: int,
    fingerprints: Mapping[str, str],
) -> Done:
    """One step that has a fingerprint: skipped, reused or run."""
    plan, step = setup.plan, run.step
    kind = KINDS[step.kind]
    deps = [fingerprints[plan.steps[i].name] for i in plan.dependencies(index)]
    if inputs is None:
        inputs = run.inputs()
    fingerprint = step_fingerprint(step.argv, step.shown_env, step.cwd, inputs, deps)
    key = venvs.key(step, inputs)
    forced = setup.options.force and kind.forced
    done = None if forced else _unchanged(setup, venvs, run, fingerprint)
    if done is None:  # it runs or is restored: its earlier record is gone, its venv made again
        setup.state.forget(step.name)
        venvs.remake(step)
        done = None if forced else _reused(setup, venvs, run, index, fingerprint, key)
        if done is None:
            return _ran(setup, venvs, run, fingerprint, deps, key)
    venvs.passed(step)  # skipped or reused: a warm clone of its venv is of no use (build.warmcheck)
    return done


def _unchanged(setup: BuildSetup, venvs: VenvReuse, run: StepRun, fingerprint: str) -> Done | None:
    """A step whose fingerprint and outputs are unchanged is skipped (its result checked again); None when
    it must run."""
    step = run.step
    entry = setup.state.get(step.name)
    if (
        # a venv an earlier step made again no longer holds what this step put in it
        venvs.made_again(step)
        or not entry
        or entry.get("fingerprint") != fingerprint
        or not run.intact(entry)
        # made without a sandbox: a build that sandboxes makes it again rather than vouch for it
        or (ran_unsandboxed(step, entry.get("outputs") or {}) and sandboxes(setup))
    ):
        return None
    run.verify(entry)
    setup.display.end_step(step, "skipped", 0.0)
    done = StepRecord(step.name, step.kind, step.project, "skipped", 0.0, entry.get("log"))
    return result_identity(fingerprint, entry), done


def _reused(
    setup: BuildSetup, venvs: VenvReuse, run: StepRun, index: int, fingerprint: str, key: str | None
) -> Done | None:
    """A step the environment store holds the result of is restored from it; None when it must run."""
    step = run.step
    restored = venvs.restore(step, index, key)
    if restored is None or (ran_unsandboxed(step, restored.outputs) and sandboxes(setup)):
        return None
    entry: dict[str, Any] = {"fingerprint": fingerprint, "outputs": restored.outputs, "log": None}
    entry["duration_s"] = restored.seconds
    venvs.save(step, entry, deferred=not restored.cloned)
    run.verify(entry)
    setup.display.end_step(step, "reused", restored.seconds)
    done = StepRecord(step.name, step.kind, step.project, "reused", restored.seconds, None)
    return result_identity(fingerprint, entry), done


def _ran(
    setup: BuildSetup, venvs: VenvReuse, run: StepRun, fingerprint: str, deps: list[str], key: str | None
) -> Done:
    """The step run, its trees checked (torchkiln.build.treewatch: before it is recorded as done, also when
    it failed), recorded, kept in the environment store and checked."""
    step = run.step
    venvs.before_run(step)
    setup.trees.before(step)
    staged = None  # the store's entry for its venv, staged while it ran: kept, or discarded here
    try:
        try:
            run.prepare()
            venvs.while_running(KINDS[step.kind])
            try:
                ran = run.execute()
            finally:
                setup.display.stop_live()
            staged = ran.staged
            outputs = run.outputs(ran)  # (a compile's probes of the build venv's tools run build code)
        except BaseException as exc:
            setup.trees.after(step, exc)  # a changed tree is what the failure says first
            raise
        setup.trees.after(step, log=ran.log)
        log = str(ran.log) if ran.log else None
        settled = run.settled_inputs(outputs)
        if settled is not None:
            fingerprint = step_fingerprint(step.argv, step.shown_env, step.cwd, settled, deps)
        entry = {"fingerprint": fingerprint, "outputs": outputs, "log": log, "duration_s": ran.seconds}
        venvs.save(step, entry)
        kept, staged = staged, None
        venvs.keep(step, key, outputs, kept)
    finally:
        EnvStore.discard(staged)
    # After recording: what was found stays valid when the check fails, and a fixed recipe only checks again.
    run.verify(entry)
    setup.display.end_step(step, "ran", ran.seconds)
    done = StepRecord(
        step.name,
        step.kind,
        step.project,
        "ran",
        ran.seconds,
        log,
        ran.phases,
        memory_retries=ran.memory_retries,
    )
    return result_identity(fingerprint, entry), done


def run_build(plan: Plan, options: BuildOptions | None = None) -> BuildResult:
    """Execute ``plan``; raises BuildFailed / ConfigureMismatch / Interrupted (all TorchkilnError)."""
    options = options or BuildOptions()
    console = options.console or make_console()
    paths = plan.paths
    try:
        paths.workdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise name_path(exc, paths.workdir) from None
    check_dist(paths.dist, plan.recipe.name)
    # supervised: nothing this build starts outlives it, also when torchkiln is SIGKILLed
    display = Display(console)
    with holding_lock(paths.workdir), runner.supervised():
        repair_layout(paths.workdir, display.note)
        setup = BuildSetup.make(
            plan,
            Options(
                options.force,
                options.skip_postcheck,
                options.min_hit_rate,
                options.allow_dirty,
                options.sign_key,
                options.secret_files,
                options.isolation,
                options.allow_unisolated,
                dict(options.before),
            ),
            options.environ if options.environ is not None else os.environ,
            State(paths.workdir / STATE_NAME),
            display,
        )
        record = BuildRecord(show=display.warn)
        for name in setup.state.dropped:
            display.note(f"{setup.state.path}: the record of {name} is damaged; that step runs again")
        paths.logs.mkdir(parents=True, exist_ok=True)
        for note in plan.notes:  # the user's explicit departures from the recipe: into the manifest
            record.warn(note)
        for leftover in clean_partials(paths.dist):
            display.note(f"removed a partial file left by an interrupted build: {leftover}")
        require_isolation_to_sign(setup)  # a signed build vouches for sandboxed steps (build.sandbox)
        check_given_trees(plan, options.allow_dirty)  # a given tree's links out of it (build.treeguard)
        with _terminate_as_interrupt():
            try:
                passes: tuple[Published | None, BuildRecord] = (None, record)
                try:
                    passes = _passes(setup, record)
                finally:
                    display.close()  # the final message (or the error) is the last thing shown
                    setup.cache.close(setup, passes[1])
            except KeyboardInterrupt:
                raise Interrupted("torchkiln build: interrupted (Ctrl-C); dist/ is unchanged") from None
        published, record = passes
        if published is None:  # a plan without a publish step (a library caller's subset)
            raise TorchkilnError("the plan has no publish step: nothing reached dist/")
        return BuildResult(
            published.wheels,
            published.manifest,
            published.lock,
            list(record.steps),
            published.sboms,
            published.provenance,
        )
