"""What the builder does around each kind of step: one class per kind, chosen by ``Step.kind``.

The plan (:mod:`torchkiln.plan`) says what runs and declares what each step leaves behind and reads; a
:class:`StepKind` turns that into behaviour, and :data:`KINDS` maps each kind to its class. The builder
(:mod:`torchkiln.build`) is a loop that asks the step's kind, never the step's name:

=========  =====================================================================================================
kind       behaviour around the command
=========  =====================================================================================================
fetch      the first step of a checkout starts from an empty directory; the checkout must stay a git work tree;
           the step that leaves it at its ref checks HEAD against the recipe's pin (also when skipped)
env        venvs and requirements: requirement files' contents are inputs; a venv that vanished is remade
compile    the source tree's identity is an input; the compiler cache session (opened before the first compile
           that runs) adds its layers to the environment; live progress, phases and the configure watcher
           read the output; the tools it used are recorded; it must leave a wheel
checks     skipped with ``--skip-checks``; a step whose output ends with the wheels' build facts is compared
           with the recipe (also when skipped: the recipe may have changed)
publish    in-process, every run: closes the cache session, applies ``--min-cache-hit-rate``, copies the wheels
           into dist/ atomically, writes the lock file and the manifest
=========  =====================================================================================================

Behaviour that belongs to a step's *data* is shared by every kind (:class:`StepKind`): ``fresh`` is emptied
before it runs, ``creates`` must still exist for it to count as done, ``reads`` are hashed into its
fingerprint, ``wheels`` is emptied before and must hold a wheel after. A new kind is a subclass and a row
in :data:`KINDS` (and the kind's name in :data:`torchkiln.plan.Kind`).

Seams for later work: :class:`Context` is what a kind may use; a host preflight (issue 11) reads the plan
before the loop; per-run cache statistics come from :attr:`Context.cache` (issue 14).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from rich.console import Console

from . import __version__, artifacts, document, runner
from .cache import CacheSession, CacheStats, enforce_min_hit_rate, open_session
from .display import Display
from .environ import compose
from .errors import BuildFailed, ConfigureMismatch, TorchkilnError
from .fingerprint import State, digest, file_sha256, tree_identity, tree_sha256
from .lock import SourceLock, write_lock
from .logs import first_error, log_name, tail
from .manifest import (
    MANIFEST_FORMAT,
    CacheRecord,
    CheckResult,
    Checks,
    HitsMisses,
    Jobs,
    Manifest,
    RecipeInfo,
    StepRecord,
    WheelRecord,
    stages_of,
    write_manifest,
)
from .plan import Plan, Step
from .progress import CompileProgress, PhaseTracker, format_duration
from .source import check_pin, head_commit, is_git_checkout, lock_source
from .toolchain import Tool, Toolchain, collect, tool_version
from .verify.buildconfig import postbuild_checks
from .verify.facts import BuildFacts
from .watch import Contradiction, Expectations, SummaryWatcher

TAIL_LINES = 25


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

    def warn(self, text: str) -> None:
        self.warnings.append(text)
        self.display.warn(text)

    def redact(self, text: str) -> str:
        return self.cache.redact(text) if self.cache is not None else text

    def open_cache(self, step: Step) -> CacheSession:
        """Before the first compile that runs: tool present, remote usable (else one warning), stats zeroed."""
        if self.cache is None:
            tool_environ = compose(self.environ, step.env, path_prepend=step.path_prepend)
            self.cache = open_session(self.plan.cache, tool_environ, basedir=self.plan.paths.workdir)
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


# --------------------------------------------------------------------------------------------------
# The kinds.
# --------------------------------------------------------------------------------------------------


class StepKind:
    """A kind of step. The defaults implement what a step's declared data asks for."""

    name: ClassVar[str] = ""
    optional: ClassVar[bool] = False  # skipped altogether by --skip-checks
    always_runs: ClassVar[bool] = False  # no fingerprint: runs on every build

    def inputs(self, step: Step, ctx: Context) -> dict[str, str]:
        """What the step's result depends on besides its argv, env, cwd and the steps before it."""
        return {path: file_sha256(Path(path)) for path in step.reads if Path(path).is_file()}

    def intact(self, step: Step, entry: Mapping[str, Any], ctx: Context) -> bool:
        """Whether what the step left last time is still there (else it runs again)."""
        if step.creates is not None and not Path(step.creates).exists():
            return False
        if step.wheels is not None:
            recorded = entry.get("outputs", {}).get("wheels", {})
            return bool(recorded) and all(
                (Path(step.wheels) / name).is_file() and file_sha256(Path(step.wheels) / name) == sha
                for name, sha in recorded.items()
            )
        return True

    def prepare(self, step: Step, ctx: Context) -> None:
        """Before the command: what the step makes starts from nothing (a fresh checkout is for the command to
        create; a wheel directory exists, empty)."""
        for directory in (step.fresh, step.wheels):
            if directory is not None:
                path = Path(directory)
                if path.exists():
                    shutil.rmtree(path)
                path.parent.mkdir(parents=True, exist_ok=True)
        if step.wheels is not None:
            Path(step.wheels).mkdir()

    def layers(self, step: Step, ctx: Context) -> tuple[Mapping[str, str], ...]:
        """The environment layers over the base environment (see torchkiln.environ)."""
        return (step.env,)

    def observer(self, step: Step, ctx: Context) -> LineObserver | None:
        """What reads the step's output as it arrives."""
        return None

    def execute(self, step: Step, ctx: Context) -> Ran:
        """Run the command, streaming its output to its log; a failure is BuildFailed with the first error,
        the log's tail and the log's path."""
        log = ctx.plan.paths.logs / log_name(step.name)
        env = compose(ctx.environ, *self.layers(step, ctx), path_prepend=step.path_prepend)
        observer = self.observer(step, ctx)
        try:
            done = runner.stream(
                step.argv,
                log=log,
                env=env,
                cwd=step.cwd,
                observe=observer,
                redact=ctx.redact,
                header=f"# {step.name}: {' '.join(step.argv)}",
            )
        except runner.ProcessError as exc:
            raise BuildFailed(f"{step.name}: {exc}", step=step.name) from None
        mismatch = observer.verdict() if observer is not None else None
        if mismatch:
            lines = "\n".join(f"  - {c}" for c in mismatch)
            raise ConfigureMismatch(
                f"{step.name}: stopped right after configure, CMake's summary contradicts the recipe:\n{lines}\n"
                f"full log: {log}",
                step=step.name,
                log=log,
            )
        if done.returncode != 0:
            raise BuildFailed(
                _failure_message(step, done.returncode, done.seconds, log), step=step.name, log=log
            )
        phases = observer.phases() if observer is not None else None
        return Ran(done.seconds, log, done.tail, phases)

    def outputs(self, step: Step, ran: Ran, ctx: Context) -> dict[str, Any]:
        """What to record of a successful run (read back by :meth:`intact` and later steps)."""
        out: dict[str, Any] = {}
        if step.wheels is not None:
            built = artifacts.wheels_in(Path(step.wheels))
            if not built:
                raise BuildFailed(
                    f"{step.name} finished but wrote no wheel into {step.wheels} (full log: {ran.log})",
                    step=step.name,
                    log=ran.log,
                )
            out["wheels"] = {p.name: file_sha256(p) for p in built}
        return out

    def verify(self, step: Step, entry: Mapping[str, Any], ctx: Context) -> None:
        """After the step ran (and was recorded) or was skipped: what must hold of its result."""


class FetchKind(StepKind):
    name = "fetch"

    def inputs(self, step: Step, ctx: Context) -> dict[str, str]:
        # One identity for all fetch steps of a checkout: a changed URL, ref or pin fetches it from scratch
        # (git remote add would fail on the old checkout); a resumed fetch continues.
        source = ctx.plan.source(step.project)
        group = [s.argv for s in ctx.plan.steps if s.kind == "fetch" and s.project == step.project]
        return {"commit": source.commit or "", "fetch": digest(group)}

    def intact(self, step: Step, entry: Mapping[str, Any], ctx: Context) -> bool:
        return is_git_checkout(ctx.plan.source(step.project).path)

    def outputs(self, step: Step, ran: Ran, ctx: Context) -> dict[str, Any]:
        return {"head": head_commit(ctx.plan.source(step.project).path)} if step.pins else {}

    def verify(self, step: Step, entry: Mapping[str, Any], ctx: Context) -> None:
        if step.pins:
            check_pin(ctx.plan.recipe.spec(step.project), ctx.plan.source(step.project).path)


class EnvKind(StepKind):
    name = "env"


class CompileKind(StepKind):
    name = "compile"

    def inputs(self, step: Step, ctx: Context) -> dict[str, str]:
        source = next((s for s in ctx.plan.sources if s.name == step.project), None)
        return {"tree": tree_identity(source.path)} if source is not None else {}

    def prepare(self, step: Step, ctx: Context) -> None:
        super().prepare(step, ctx)
        ctx.open_cache(step)

    def layers(self, step: Step, ctx: Context) -> tuple[Mapping[str, str], ...]:
        session = ctx.open_cache(step)
        return (step.env, session.public_env, session.secret_env)

    def observer(self, step: Step, ctx: Context) -> LineObserver:
        ctx.display.live_bar(step)
        return CompileObserver(ctx.display, SummaryWatcher(Expectations.for_step(step.env, ctx.plan.recipe)))

    def outputs(self, step: Step, ran: Ran, ctx: Context) -> dict[str, Any]:
        out = super().outputs(step, ran, ctx)
        session = ctx.open_cache(step)
        env = compose(ctx.environ, step.env, session.public_env, path_prepend=step.path_prepend)
        toolchain = collect(
            env,
            ctx.plan.paths.venv_python,
            cuda=ctx.plan.recipe.accelerator.is_cuda,
            cache_tool=session.config.kind if session.config.enabled else None,
        )
        out["toolchain"] = document.to_data(toolchain)
        out["env"] = {**step.env, **session.public_env}  # what it ran with: the cache's effective variables
        source = next((s for s in ctx.plan.sources if s.name == step.project), None)
        if source is not None and not is_git_checkout(source.path):
            out["tree_sha256"] = tree_sha256(source.path)  # no commit names this tree: its contents do
        return out


class ChecksKind(StepKind):
    name = "checks"
    optional = True

    def outputs(self, step: Step, ran: Ran, ctx: Context) -> dict[str, Any]:
        out = super().outputs(step, ran, ctx)
        if step.facts:
            out["facts"] = _last_json(ran.tail)
        return out

    def verify(self, step: Step, entry: Mapping[str, Any], ctx: Context) -> None:
        if step.facts:
            # Also when skipped: the wheels are unchanged, the recipe may not be.
            ctx.checks = _compare_with_recipe(
                ctx, step, entry.get("outputs", {}).get("facts"), entry.get("log")
            )


class PublishKind(StepKind):
    name = "publish"
    always_runs = True

    def execute(self, step: Step, ctx: Context) -> Ran:
        """The end of a build that succeeded: cache statistics (and the hit-rate gate), wheels into dist/,
        the lock file, the manifest."""
        ctx.close_cache()
        if ctx.cache is not None:
            enforce_min_hit_rate(ctx.cache_stats, ctx.options.min_hit_rate)
        plan, paths = ctx.plan, ctx.plan.paths
        wheels, changed = _publish_wheels(ctx)
        for stale in artifacts.remove_superseded(paths.dist, [w for w, _ in wheels]):
            ctx.display.note(f"removed superseded wheel {stale}")
            changed = True
        locks = _locks(ctx)
        lock_path = paths.dist / f"{plan.recipe.name}.lock.json"
        write_lock(lock_path, plan.recipe.name, plan.recipe.sha256, locks)
        manifest_path = paths.dist / "manifest.json"
        write_manifest(manifest_path, _manifest(ctx, locks, [WheelRecord.of(w, p) for w, p in wheels]))
        ctx.published = Published([w for w, _ in wheels], manifest_path, lock_path)
        return Ran(0.0, None, status="ran" if changed else "skipped")


KINDS: dict[str, StepKind] = {
    kind.name: kind for kind in (FetchKind(), EnvKind(), CompileKind(), ChecksKind(), PublishKind())
}


# --------------------------------------------------------------------------------------------------
# Reading a compile step's output.
# --------------------------------------------------------------------------------------------------


class LineObserver:
    """Reads a step's output line by line (runner.stream); True from ``__call__`` stops the step."""

    def __call__(self, line: str) -> bool:
        return False

    def verdict(self) -> list[Contradiction] | None:
        """Contradictions that stopped (or, at the end of the output, would stop) the step."""
        return None

    def phases(self) -> dict[str, float] | None:
        return None


class CompileObserver(LineObserver):
    """ninja's progress to the display, the wheel step's phases, and the configure watcher."""

    def __init__(self, display: Display, watcher: SummaryWatcher) -> None:
        self.display = display
        self.watcher = watcher
        self.progress = CompileProgress()
        self.tracker = PhaseTracker()
        self.mismatch: list[Contradiction] | None = None

    def __call__(self, line: str) -> bool:
        entered = self.tracker.feed(line)
        if entered is not None:
            self.display.phase(entered)
        p = self.progress.feed(line)
        if p is not None:
            self.display.compile_progress(p.describe(), p.done, p.total, p.percent)
        verdict = self.watcher.feed(line)
        if verdict:
            self.mismatch = verdict
            return True
        return False

    def verdict(self) -> list[Contradiction] | None:
        if self.mismatch is None:
            self.mismatch = self.watcher.close() or None
        return self.mismatch

    def phases(self) -> dict[str, float] | None:
        return self.tracker.finish()


# --------------------------------------------------------------------------------------------------
# Helpers of the kinds.
# --------------------------------------------------------------------------------------------------


def _failure_message(step: Step, code: int | None, seconds: float, log: Path) -> str:
    error = first_error(log)
    lines = [f"{step.name} failed (exit {code}) after {format_duration(seconds)}"]
    if error:
        lines.append(f"first error: {error}")
    lines.append("last lines of the log:")
    lines += [f"  {line}" for line in tail(log, TAIL_LINES)]
    lines.append(f"full log: {log}")
    return "\n".join(lines)


def _last_json(lines: list[str]) -> dict[str, Any] | None:
    for line in reversed(lines):
        text = line.strip()
        if text.startswith("{"):
            with contextlib.suppress(ValueError):
                data = json.loads(text)
                if isinstance(data, dict):
                    return data
    return None


def _compare_with_recipe(
    ctx: Context, step: Step, facts_doc: dict[str, Any] | None, log: str | None
) -> Checks:
    """The post-build check's verdict: the built wheels' facts against the recipe, with the comparison the
    verification suite uses, and each torch/torchvision commit against the checkout it was built from. Any
    mismatch stops the build before anything is published."""
    if facts_doc is None:
        raise BuildFailed(f"{step.name} printed no build facts (full log: {log})", step=step.name)
    facts = BuildFacts.from_dict(facts_doc)
    # The commit each project was built from (its checkout's HEAD), for a recipe that pins none.
    commits = {s.name: head_commit(s.path) for s in ctx.plan.sources if is_git_checkout(s.path)}
    results = postbuild_checks(ctx.plan.recipe, facts, ctx.plan.projects, commits=commits)
    failed = [c.message for c in results.values() if c.status == "fail"]
    if failed:
        lines = "\n".join(f"  - {message}" for message in failed)
        raise BuildFailed(
            f"{step.name}: the built wheels are not what the recipe asked for:\n{lines}\nfull log: {log}",
            step=step.name,
        )
    return Checks(
        torch=facts.torch_version,
        cuda=facts.cuda_version,
        torchvision=facts.torchvision.version if facts.torchvision else None,
        results={k: CheckResult(c.status, c.message) for k, c in results.items()},
    )


def _publish_wheels(ctx: Context) -> tuple[list[tuple[Path, str]], bool]:
    """Each project's wheels (of its last step that makes wheels) into dist/, those not already there.
    Returns ((path in dist, project), ...) and whether dist/ changed."""
    published: list[tuple[Path, str]] = []
    changed = False
    for project, step in ctx.plan.wheel_steps().items():
        assert step.wheels is not None
        recorded = (ctx.state.get(step.name) or {}).get("outputs", {}).get("wheels", {})
        for name in sorted(recorded):
            target = ctx.plan.paths.dist / name
            if not (target.is_file() and file_sha256(target) == recorded[name]):
                artifacts.publish(Path(step.wheels) / name, ctx.plan.paths.dist)
                changed = True
            published.append((target, project))
    return published, changed


def _locks(ctx: Context) -> list[SourceLock]:
    locks = []
    for source in ctx.plan.sources:
        step = ctx.plan.wheel_steps().get(source.name)
        entry = (ctx.state.get(step.name) or {}) if step is not None else {}
        locks.append(
            lock_source(
                source.name,
                source.path,
                repo=None if source.provided else source.repo,
                ref=None if source.provided else source.ref,
                provided=source.provided,
                tree_digest=entry.get("outputs", {}).get("tree_sha256"),
            )
        )
    return locks


def _toolchain(ctx: Context, locks: list[SourceLock]) -> Toolchain:
    """The compile steps' recorded toolchains (the first of each tool wins; a tool two projects used at
    different versions is a warning), plus git when the build read a git checkout."""
    merged: Toolchain | None = None
    for step in ctx.plan.steps:
        if step.kind != "compile":
            continue
        raw = (ctx.state.get(step.name) or {}).get("outputs", {}).get("toolchain")
        if raw is None:
            continue
        found = document.from_data(Toolchain, raw, file=str(ctx.state.path))
        if merged is None:
            merged = found
            continue
        for name, tool in found.tools.items():
            known = merged.tools.get(name)
            if known is None:
                merged.tools[name] = tool
            elif known.version != tool.version:
                ctx.warn(
                    f"{step.project} was compiled with {name} {tool.version}, another project with {known.version}"
                )
    merged = merged or Toolchain()
    if any(lock.commit is not None for lock in locks):
        git: Tool | None = tool_version("git", ctx.environ)
        if git is not None:
            merged.tools["git"] = git
    return merged


def _manifest(ctx: Context, locks: list[SourceLock], wheels: list[WheelRecord]) -> Manifest:
    plan, recipe = ctx.plan, ctx.plan.recipe
    steps = [replace(r, last_run_s=_last_run(ctx, r.name)) for r in ctx.records if r.stage != "publish"]
    build_env = {
        step.project: (ctx.state.get(step.name) or {}).get("outputs", {}).get("env", step.shown_env)
        for step in plan.steps
        if step.kind == "compile"
    }
    checks = Checks(skipped=True) if ctx.options.skip_checks else (ctx.checks or Checks())
    return Manifest(
        format=MANIFEST_FORMAT,
        torchkiln=__version__,
        started=ctx.started.isoformat(timespec="seconds"),
        finished=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        recipe=RecipeInfo(
            name=recipe.name,
            path=str(recipe.path) if recipe.path else None,
            sha256=recipe.sha256,
            torch_version=recipe.torch_wheel_version,
            torchvision_version=recipe.torchvision_wheel_version,
            python=recipe.python,
            accelerator=recipe.accelerator.kind,
            cuda=str(recipe.accelerator.cuda) if recipe.accelerator.cuda else None,
            arch_list=list(recipe.accelerator.arch_list),
        ),
        projects=list(plan.projects),
        jobs=Jobs(plan.jobs.value, plan.jobs.source, plan.jobs.reason),
        sources={lock.name: lock for lock in locks},
        toolchain=_toolchain(ctx, locks),
        build_env=build_env,
        stages=stages_of(steps),
        steps=steps,
        cache=_cache_record(ctx.cache_stats) if ctx.cache_stats is not None else None,
        checks=checks,
        wheels=wheels,
        warnings=list(ctx.warnings),
    )


def _cache_record(stats: CacheStats) -> CacheRecord:
    rate = stats.hit_rate
    return CacheRecord(
        stats.tool,
        stats.hits,
        stats.misses,
        stats.uncacheable,
        None if rate is None else round(rate, 4),
        HitsMisses(stats.local_hits, stats.local_misses),
        HitsMisses(stats.remote_hits, stats.remote_misses),
        stats.errors,
        {k: HitsMisses(h, m) for k, (h, m) in sorted(stats.by_language.items())},
    )


def _last_run(ctx: Context, name: str) -> float | None:
    entry = ctx.state.get(name)
    return round(entry["duration_s"], 3) if entry and "duration_s" in entry else None
