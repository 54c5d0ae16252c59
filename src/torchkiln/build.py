"""Run a :class:`~torchkiln.plan.Plan`: the steps in order, and the behaviour a long build needs around them.

The plan says *what* runs (argv, env, cwd of every step); this module adds:

- the pin check after each project's fetch, and ``dist/<recipe>.lock.json`` with every resolved SHA;
- fingerprints (:mod:`torchkiln.fingerprint`): an unchanged step is skipped, so a rerun with nothing
  changed finishes in seconds; ``force`` runs everything again;
- per-step log files, a live display (ninja's ``[done/total]`` as percent and ETA), and on failure the
  first compiler error, the log's tail and the log's path;
- the configure watcher (:mod:`torchkiln.watch`) on the compile steps: a CMake summary that contradicts the
  recipe stops the build right after configure instead of hours later;
- compiler-cache statistics (:mod:`torchkiln.cache`), the post-build import check (the plan's ``checks:*``
  steps), then wheels into dist/ atomically and ``dist/manifest.json``.

Interrupts (Ctrl-C, SIGTERM) stop the running step's whole process group and leave dist/ untouched: wheels
reach dist/ only after everything succeeded (:mod:`torchkiln.artifacts`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

from .artifacts import clean_partials, publish, remove_superseded, wheel_info, wheels_in
from .cache import (
    PreparedCache,
    enforce_min_hit_rate,
    finish_cache,
    launcher_env,
    prepare_cache,
    read_stats,
)
from .errors import TorchkilnError
from .fingerprint import State, digest, file_sha256, step_fingerprint, tree_identity
from .logs import first_error, log_name, tail
from .manifest import build_manifest, toolchain
from .plan import Plan, Step, base_environment
from .progress import CompileProgress, PhaseTracker, format_duration
from .source import check_pin, is_git_checkout, lock_source, write_json_atomic, write_lock
from .verify.buildconfig import postbuild_checks
from .verify.facts import BuildFacts
from .watch import Expectations, SummaryWatcher

REQUIREMENT_FILES = ("requirements-build.txt", "requirements.txt", "pyproject.toml", "setup.py")
KILL_GRACE_S = 10.0
TAIL_LINES = 25


class BuildFailed(TorchkilnError):
    """A step failed: the message carries the first error, the log tail and the log path."""

    def __init__(self, message: str, *, step: str, log: Path | None = None) -> None:
        super().__init__(message)
        self.step = step
        self.log = log


class ConfigureMismatch(BuildFailed):
    """CMake's configuration summary contradicts the recipe: stopped before compiling."""


class Interrupted(TorchkilnError):
    """Ctrl-C or SIGTERM: the running step was stopped, dist/ is unchanged."""

    exit_code = 130


@dataclass
class BuildOptions:
    force: bool = False
    skip_checks: bool = False
    min_hit_rate: float | None = None
    console: Console | None = None
    environ: Mapping[str, str] | None = None


@dataclass
class StepRecord:
    name: str
    stage: str
    project: str
    status: str  # "ran" | "skipped"
    duration_s: float
    log: str | None
    phases: dict[str, float] | None = None  # wheel steps: configure / compile / wheel seconds

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "stage": self.stage,
            "project": self.project,
            "status": self.status,
            "duration_s": round(self.duration_s, 3),
            "log": self.log,
            **({"phases": self.phases} if self.phases else {}),
        }


@dataclass
class BuildResult:
    wheels: list[Path]
    manifest: Path
    lock: Path
    steps: list[StepRecord] = field(default_factory=list)

    @property
    def ran(self) -> list[str]:
        return [s.name for s in self.steps if s.status == "ran"]


# --------------------------------------------------------------------------------------------------
# Signals: SIGTERM behaves like Ctrl-C, so one cleanup path handles both.
# --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
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


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop the step's whole process group (ninja, compilers, ...): SIGTERM, then SIGKILL after a grace
    period. Returns once the leader and every other member are gone, so nothing keeps compiling."""
    pgid = proc.pid  # start_new_session=True: the step leads its own group
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _group_alive(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        proc.wait()
        while _group_alive(pgid) and time.monotonic() < deadline + KILL_GRACE_S:
            time.sleep(0.05)


@contextlib.contextmanager
def _workdir_lock(workdir: Path) -> Iterator[None]:
    """One build per workdir at a time: two would fetch into, and record state for, the same checkout."""
    path = workdir / "build.lock"
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise TorchkilnError(
                f"another torchkiln build is running in {workdir} ({holder}); wait for it, or use another --workdir"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------------
# Display.
# --------------------------------------------------------------------------------------------------


class Display:
    """One line per step; during a compile, a progress bar with ninja's percent and ETA.

    On a terminal the bar is live; elsewhere (CI logs) a progress line is printed every 10 %.
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self._progress: Progress | None = None
        self._task: Any = None
        self._last_decile = -1

    def start_step(self, index: int, count: int, step: Step) -> None:
        self.console.print(f"[bold]{index}/{count}[/bold] [cyan]{step.stage}[/cyan] {step.name}")
        self._last_decile = -1

    def running(self, step: Step) -> None:
        """The step runs (it was not skipped): a live bar for a compile on a terminal."""
        if step.stage == "compile" and self.console.is_terminal:
            self._progress = Progress(
                TextColumn("  {task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                TextColumn("{task.fields[detail]}"),
                console=self.console,
                transient=True,
            )
            self._task = self._progress.add_task(step.name, total=None, detail="starting")
            self._progress.start()

    def compile_progress(self, describe: str, done: int, total: int, percent: float) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=done, total=total, detail=describe)
            return
        decile = int(percent // 10)
        if decile > self._last_decile:
            self._last_decile = decile
            self.console.print(f"  compile {describe}")

    def phase(self, name: str) -> None:
        """A wheel step entered a new phase (configure, compile, wheel)."""
        if self._progress is not None:
            self._progress.update(self._task, detail=name)
        else:
            self.console.print(f"  {name}")

    def end_step(self, step: Step, status: str, seconds: float) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        mark = {"ran": "[green]done[/green]", "skipped": "[dim]unchanged, skipped[/dim]"}.get(status, status)
        self.console.print(f"  {mark} ({format_duration(seconds)})" if status == "ran" else f"  {mark}")

    def note(self, text: str) -> None:
        self.console.print(f"  {text}")


# --------------------------------------------------------------------------------------------------
# The builder.
# --------------------------------------------------------------------------------------------------


def step_environment(
    plan: Plan, step: Step, environ: Mapping[str, str], cache_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The process env of ``step``: the base env (steering variables removed), Step.path_prepend in front of
    PATH (the build venv's bin/ for compile steps), then Step.env (which holds VIRTUAL_ENV for them).

    ``cache_env`` is the run-time cache environment (:func:`torchkiln.cache.prepare_cache`): the plan's
    cache variables with the secrets filled in, or without the remote store when it is unreachable. It
    replaces the plan's (masked) cache variables of a compile step.
    """
    env = base_environment(environ)
    if step.path_prepend:
        env["PATH"] = os.pathsep.join([*step.path_prepend, env.get("PATH", os.defpath)])
    if step.stage == "compile" and cache_env is not None:
        shown = launcher_env(plan.cache, basedir=plan.paths.workdir)
        env.update({k: v for k, v in step.env.items() if k not in shown})
        env.update(cache_env)
    else:
        env.update(step.env)
    return env


class Builder:
    def __init__(self, plan: Plan, options: BuildOptions) -> None:
        self.plan = plan
        self.options = options
        self.console = options.console or Console(highlight=False)
        self.display = Display(self.console)
        self.environ = dict(options.environ if options.environ is not None else os.environ)
        self.paths = plan.paths
        self.state = State(self.paths.workdir / "state.json")
        self.specs = {"torch": plan.recipe.torch, "torchvision": plan.recipe.torchvision}
        self.sources = {s.name: s for s in plan.sources}
        self.prepared: PreparedCache | None = None
        self._cache_tool_env: dict[str, str] = {}
        self._final_stats: Any = None
        self.fingerprints: dict[str, str] = {}
        self.records: list[StepRecord] = []
        self.cache_stats: dict[str, Any] | None = None
        self.checks: dict[str, Any] | None = None
        self.warnings: list[str] = []

    # -- helpers -------------------------------------------------------------------------------------

    def _redact(self, text: str) -> str:
        return self.prepared.redact(text) if self.prepared is not None else text

    def _deps(self, index: int) -> list[str]:
        step = self.plan.steps[index]
        related = {"", step.project} | ({"torch"} if step.project == "torchvision" else set())
        if step.project == "":
            related = {s.project for s in self.plan.steps}
        return [self.fingerprints[s.name] for s in self.plan.steps[:index] if s.project in related]

    def _inputs(self, step: Step) -> dict[str, str]:
        if step.stage == "compile" and step.project in self.sources:
            return {"tree": tree_identity(self.sources[step.project].path)}
        if step.name == "build-env:deps":
            files = {}
            for source in self.sources.values():
                for name in REQUIREMENT_FILES:
                    path = source.path / name
                    if path.is_file():
                        files[f"{source.name}/{name}"] = file_sha256(path)
            return files
        if step.stage == "checks":
            return {"skip": str(self.options.skip_checks)}
        if step.stage == "fetch" and step.project in self.specs:
            # One identity for all fetch steps of a project: a changed URL, ref or pin refetches from
            # scratch (git remote add would fail on the old checkout), a resumed fetch continues.
            group = [s.argv for s in self.plan.steps if s.stage == "fetch" and s.project == step.project]
            return {"commit": self.specs[step.project].commit or "", "fetch": digest(group)}
        return {}

    def _outputs_intact(self, step: Step, entry: Mapping[str, Any]) -> bool:
        outputs = entry.get("outputs", {})
        if step.stage == "fetch":
            path = self.sources[step.project].path
            return is_git_checkout(path) if outputs.get("git") else path.exists()
        if step.name == "build-env:venv":
            return self.paths.venv_python.exists()
        if step.name == "checks:venv":
            return (self.paths.check_venv / "bin" / "python").exists()
        wheel_dir = self.paths.wheel_dir(step)
        for name, sha in outputs.get("wheels", {}).items():
            path = wheel_dir / name if wheel_dir else None
            if path is None or not path.is_file() or file_sha256(path) != sha:
                return False
        return True

    # -- the run -------------------------------------------------------------------------------------

    def run(self) -> BuildResult:
        self.paths.workdir.mkdir(parents=True, exist_ok=True)
        with _workdir_lock(self.paths.workdir):
            return self._run_locked()

    def _run_locked(self) -> BuildResult:
        started = dt.datetime.now(dt.UTC)
        self.paths.logs.mkdir(parents=True, exist_ok=True)
        for leftover in clean_partials(self.paths.dist):
            self.display.note(f"removed a partial file left by an interrupted build: {leftover}")
        if self.options.force:
            self.state.clear()
        with _terminate_as_interrupt():
            try:
                try:
                    self._run_steps()
                finally:
                    self._close_cache()
                if self.prepared is not None and self.options.min_hit_rate is not None:
                    enforce_min_hit_rate(self._final_stats, self.options.min_hit_rate)
                return self._finish(started)
            except KeyboardInterrupt:
                raise Interrupted("torchkiln build: interrupted (Ctrl-C); dist/ is unchanged") from None

    def _open_cache(self, step: Step) -> None:
        """Before the first compile that runs: tool present, remote usable (else one warning), stats zeroed."""
        self._cache_tool_env = step_environment(self.plan, step, self.environ)
        self.prepared = prepare_cache(self.plan.cache, self._cache_tool_env, basedir=self.plan.paths.workdir)
        for warning in self.prepared.warnings:
            self._warn(warning)

    def _close_cache(self) -> None:
        """This build's statistics; stops an sccache server the build started."""
        if self.prepared is None:
            return
        try:
            stats = finish_cache(self.prepared, self._cache_tool_env)
        except TorchkilnError as exc:
            self.warnings.append(f"compiler cache statistics unavailable: {exc}")
            return
        self._final_stats = stats
        if stats is not None:
            self.cache_stats = stats.as_dict()
            self.console.print(f"  compiler cache: {stats.summary()}")

    def _check_provided_pins(self) -> None:
        """A --source-dir checkout must be at the recipe's pinned commit too (before anything builds)."""
        for source in self.plan.sources:
            if source.provided and self.specs[source.name].commit is not None:
                if is_git_checkout(source.path):
                    check_pin(self.specs[source.name], source.path)
                else:
                    self._warn(
                        f"{source.name}: --source-dir {source.path} is not a git checkout: the recipe's "
                        f"{source.name}.commit pin could not be checked"
                    )

    def _warn(self, text: str) -> None:
        self.warnings.append(text)
        self.console.print(f"[yellow]warning:[/yellow] {text}")

    def _run_steps(self) -> None:
        self._check_provided_pins()
        steps = self.plan.steps
        last_fetch = {s.project: s.name for s in steps if s.stage == "fetch"}
        first_fetch = {}
        for s in steps:
            if s.stage == "fetch":
                first_fetch.setdefault(s.project, s.name)
        for index, step in enumerate(steps):
            if step.stage == "checks" and self.options.skip_checks:
                self.fingerprints[step.name] = digest({"skipped": step.name})
                continue
            inputs = self._inputs(step)
            fingerprint = step_fingerprint(step.argv, step.env, step.cwd, inputs, self._deps(index))
            self.fingerprints[step.name] = fingerprint
            entry = self.state.get(step.name)
            self.display.start_step(index + 1, len(steps), step)
            if entry and entry.get("fingerprint") == fingerprint and self._outputs_intact(step, entry):
                self.records.append(
                    StepRecord(step.name, step.stage, step.project, "skipped", 0.0, entry.get("log"))
                )
                if step.stage == "compile" and entry.get("cache_stats") is not None:
                    self.cache_stats = entry["cache_stats"]
                if step.name == "checks:import":
                    # The wheels are unchanged, the recipe may not be: compare their recorded facts again.
                    self.checks = self._compare_with_recipe(entry.get("facts"), Path(entry.get("log", "")))
                if step.name == last_fetch.get(step.project):
                    check_pin(self.specs[step.project], self.sources[step.project].path)
                self.display.end_step(step, "skipped", 0.0)
                continue
            self.state.forget(step.name)
            if step.name == first_fetch.get(step.project):
                dest = self.sources[step.project].path
                if dest.exists():
                    shutil.rmtree(dest)  # a torchkiln-owned checkout under the workdir: refetch from scratch
                dest.parent.mkdir(parents=True, exist_ok=True)
            outputs: dict[str, Any] = {}
            wheel_dir = self.paths.wheel_dir(step)
            if wheel_dir is not None:  # a step that makes wheels starts from an empty directory
                if wheel_dir.exists():
                    shutil.rmtree(wheel_dir)
                wheel_dir.mkdir(parents=True)
            if step.stage == "compile" and self.prepared is None:
                self._open_cache(step)
            cache_env = self.prepared.env if self.prepared is not None else None
            env = step_environment(self.plan, step, self.environ, cache_env)
            self.display.running(step)
            seconds, log, output_tail, phases = self._execute(step, env)
            if step.stage == "fetch":
                outputs["git"] = True
                if step.name == last_fetch.get(step.project):
                    head = check_pin(self.specs[step.project], self.sources[step.project].path)
                    outputs["head"] = head
            if wheel_dir is not None:
                built = wheels_in(wheel_dir)
                if not built:
                    raise BuildFailed(
                        f"{step.name} finished but wrote no wheel into {wheel_dir} (full log: {log})",
                        step=step.name,
                        log=log,
                    )
                outputs["wheels"] = {p.name: file_sha256(p) for p in built}
            extra: dict[str, Any] = {}
            if step.stage == "compile" and self.prepared is not None:
                stats = read_stats(self.prepared.config, env)
                self.cache_stats = stats.as_dict() if stats is not None else None
                extra["cache_stats"] = self.cache_stats
            if step.name == "checks:import":
                extra["facts"] = _last_json(output_tail)
            self.state.record(
                step.name,
                {
                    "fingerprint": fingerprint,
                    "outputs": outputs,
                    "log": str(log),
                    "duration_s": seconds,
                    **extra,
                },
            )
            if step.name == "checks:import":
                # After recording: the facts stay valid when the comparison fails, and a fixed recipe
                # only compares them again.
                self.checks = self._compare_with_recipe(extra["facts"], log)
            self.records.append(
                StepRecord(step.name, step.stage, step.project, "ran", seconds, str(log), phases)
            )
            self.display.end_step(step, "ran", seconds)

    def _compare_with_recipe(self, facts_doc: dict[str, Any] | None, log: Path) -> dict[str, Any]:
        """The post-build check's verdict: the built wheels' facts against the recipe, with the comparison
        the verification suite uses. Any mismatch stops the build before anything is published."""
        if facts_doc is None:
            raise BuildFailed(
                f"checks:import printed no build facts (full log: {log})", step="checks:import", log=log
            )
        facts = BuildFacts.from_dict(facts_doc)
        results = postbuild_checks(self.plan.recipe, facts, self.plan.projects)
        failed = [c.message for c in results.values() if c.status == "fail"]
        if failed:
            lines = "\n".join(f"  - {message}" for message in failed)
            raise BuildFailed(
                f"checks:import: the built wheels are not what the recipe asked for:\n{lines}\nfull log: {log}",
                step="checks:import",
                log=log,
            )
        return {
            "torch": facts.torch_version,
            "cuda": facts.cuda_version,
            "torchvision": facts.torchvision.version if facts.torchvision else None,
            "results": {k: {"status": c.status, "message": c.message} for k, c in results.items()},
        }

    def _execute(
        self, step: Step, env: dict[str, str]
    ) -> tuple[float, Path, list[str], dict[str, float] | None]:
        """Run one step, streaming its output to its log and the display. Returns (seconds, log, tail)."""
        log = self.paths.logs / log_name(step.name)
        watcher = None
        if step.stage == "compile" and step.project == "torch":
            watcher = SummaryWatcher(Expectations.for_step(step.env, self.plan.recipe))
        progress = CompileProgress()
        phases = PhaseTracker() if step.stage == "compile" else None
        last_lines: list[str] = []
        start = time.monotonic()
        cwd = step.cwd
        if cwd is not None and not Path(cwd).is_dir():
            raise BuildFailed(f"{step.name}: working directory {cwd} does not exist", step=step.name)
        try:
            proc = subprocess.Popen(  # noqa: S603 - argv list from the plan, never a shell
                list(step.argv),
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped as a whole
            )
        except FileNotFoundError:
            raise BuildFailed(
                f"{step.name}: {step.argv[0]} not found (is it installed and on PATH?)", step=step.name
            ) from None
        mismatch = None
        completed = False
        assert proc.stdout is not None
        try:
            with log.open("w", encoding="utf-8") as handle:
                handle.write(f"# {step.name}: {' '.join(step.argv)}\n")
                for raw in proc.stdout:
                    line = self._redact(raw.decode("utf-8", errors="replace"))
                    handle.write(line)
                    handle.flush()
                    last_lines.append(line.rstrip("\n"))
                    if len(last_lines) > 200:
                        del last_lines[:100]
                    if phases is not None and (entered := phases.feed(line)) is not None:
                        self.display.phase(entered)
                    p = progress.feed(line)
                    if p is not None:
                        self.display.compile_progress(p.describe(), p.done, p.total, p.percent)
                    if watcher is not None:
                        verdict = watcher.feed(line)
                        if verdict:
                            mismatch = verdict
                            handle.write("# torchkiln: configure contradicts the recipe; build stopped\n")
                            break
            if mismatch is None and watcher is not None:
                mismatch = watcher.close() or None
            if mismatch is None:
                proc.wait()
                completed = True
        finally:
            if not completed:  # stopped by the watcher, Ctrl-C or SIGTERM
                _stop_group(proc)
            proc.stdout.close()
        seconds = time.monotonic() - start
        if mismatch:
            lines = "\n".join(f"  - {c}" for c in mismatch)
            raise ConfigureMismatch(
                f"{step.name}: stopped right after configure, CMake's summary contradicts the recipe:\n{lines}\n"
                f"full log: {log}",
                step=step.name,
                log=log,
            )
        if proc.returncode != 0:
            raise BuildFailed(_failure_message(step, proc.returncode, seconds, log), step=step.name, log=log)
        return seconds, log, last_lines, phases.finish() if phases is not None else None

    # -- the end -------------------------------------------------------------------------------------

    def _finish(self, started: dt.datetime) -> BuildResult:
        plan = self.plan
        locks = [
            lock_source(
                s.name,
                s.path,
                repo=None if s.provided else s.repo,
                ref=None if s.provided else s.ref,
                provided=s.provided,
            )
            for s in plan.sources
        ]
        published: list[Path] = []
        wheels: list[dict[str, Any]] = []
        for project in plan.projects:
            final = plan.final_wheel_step(project)  # the bundling step of torchvision, if it has one
            if final is None:
                continue
            entry = self.state.get(final.name) or {}
            wheel_dir = self.paths.wheel_dir(final)
            assert wheel_dir is not None
            for name in sorted(entry.get("outputs", {}).get("wheels", {})):
                source = wheel_dir / name
                target = self.paths.dist / name
                if not (target.is_file() and file_sha256(target) == entry["outputs"]["wheels"][name]):
                    publish(source, self.paths.dist)
                published.append(target)
                wheels.append(wheel_info(target, project).to_dict())
        for stale in remove_superseded(self.paths.dist, published):
            self.display.note(f"removed superseded wheel {stale}")
        lock_path = self.paths.dist / f"{plan.recipe.name}.lock.json"
        lock_doc = write_lock(lock_path, plan.recipe.name, plan.recipe.sha256, locks)
        compile_step = next((s for s in plan.steps if s.stage == "compile"), None)
        tool_env = (
            step_environment(plan, compile_step, self.environ)
            if compile_step
            else base_environment(self.environ)
        )
        manifest = build_manifest(
            plan_dict=plan.to_dict(),
            sources=lock_doc["sources"],
            toolchain_info=toolchain(tool_env, self.paths.venv_python, tool_env.get("CUDA_HOME")),
            build_env={s.project: s.env for s in plan.steps if s.stage == "compile"},
            steps=[r.to_dict() | {"last_run_s": self._last_run(r)} for r in self.records],
            cache=self.cache_stats,
            wheels=wheels,
            checks=self.checks if not self.options.skip_checks else {"skipped": True},
            started=started,
            finished=dt.datetime.now(dt.UTC),
        )
        manifest["warnings"] = self.warnings
        manifest_path = self.paths.dist / "manifest.json"
        write_json_atomic(manifest_path, manifest)
        return BuildResult(published, manifest_path, lock_path, self.records)

    def _last_run(self, record: StepRecord) -> float | None:
        entry = self.state.get(record.name)
        return round(entry["duration_s"], 3) if entry and "duration_s" in entry else None


def _failure_message(step: Step, code: int, seconds: float, log: Path) -> str:
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


def run_build(plan: Plan, options: BuildOptions | None = None) -> BuildResult:
    """Execute ``plan``; raises BuildFailed / ConfigureMismatch / Interrupted (all TorchkilnError)."""
    return Builder(plan, options or BuildOptions()).run()
