"""A kind of step (:class:`StepKind`: how the loop treats its steps) and the run it starts for one step of one
build (:class:`StepRun`), whose defaults implement what a step's declared data asks for.

``fresh`` is emptied before the step runs, ``creates`` must still exist for it to count as done, ``reads`` are
hashed into its fingerprint, ``wheels`` is emptied before and must hold a wheel after, and a ``venv`` must
still hold what the build installed in it. A run holds what it learns while its step runs (a compile's tree
before and after it) and hands its inputs, result and outputs back to the loop as values; it reads the
build's :class:`~torchkiln.build.context.BuildSetup` and adds what it found to its
:class:`~torchkiln.build.context.BuildRecord`. Keeping and reusing venvs in the environment store is not a
kind's business: :class:`~torchkiln.build.venvreuse.VenvReuse`, which the loop consults around each step. The
other kinds' runs subclass :class:`StepRun`, each in its family's module;
:data:`torchkiln.build.kinds.KINDS` maps each kind's name to its :class:`StepKind`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchkiln.artifacts import published
from torchkiln.errors import BuildFailed, ConfigureMismatch, few
from torchkiln.plan.model import Step
from torchkiln.process import runner
from torchkiln.process.environ import compose

from .context import BuildRecord, BuildSetup, Ran, failure_message
from .envstore import venv_distributions
from .fingerprint import digest, file_sha256
from .observers import LineObserver
from .sandbox import how, isolated

Stage = Callable[[], "Path | None"]  # begins the store's entry for a step's venv (VenvReuse.stage)


def _nothing_staged() -> Path | None:
    return None


class StepRun:
    """One step's run in one build: what its kind does around its command, and what it learned meanwhile.
    Made afresh for each step of each build (:meth:`StepKind.start`), so nothing it holds outlives the step
    or reaches another build."""

    def __init__(
        self, step: Step, setup: BuildSetup, record: BuildRecord, stage: Stage | None = None
    ) -> None:
        self.step, self.setup, self.record = step, setup, record
        # the environment store's entry for the step's venv, begun while it still runs (VenvReuse.stage)
        self.stage: Stage = stage if stage is not None else _nothing_staged
        self.isolation: str | None = None  # how its command ran (build.sandbox), once it ran

    def inputs(self) -> dict[str, str]:
        """What the step's result depends on besides its argv, env, cwd and the steps before it: the content
        of what it reads (a file's sha256; a directory's wheels, each by name and sha256)."""
        found: dict[str, str] = {}
        for name in self.step.reads:
            path = Path(name)
            if "*" in path.name:  # a pattern: the files it matches, each by name and sha256
                found[name] = _files_digest(path.parent.glob(path.name))
            elif path.is_file():
                found[name] = file_sha256(path)
            elif path.is_dir():
                found[name] = _files_digest(published.wheels_in(path))
        return found

    def intact(self, entry: Mapping[str, Any]) -> bool:
        """Whether what the step left last time is still there (else it runs again). A venv must still hold
        what the build installed in it (:func:`_venv_as_recorded`)."""
        step = self.step
        if step.creates is not None and not Path(step.creates).exists():
            return False
        if step.venv is not None and not _venv_as_recorded(step, self.setup):
            return False
        if step.wheels is not None:
            # exactly the wheels it made: a wheel dropped in beside them (pip would pick from them, the
            # checks would install it) makes the step run again, from an empty directory
            recorded = entry.get("outputs", {}).get("wheels", {})
            present = {p.name for p in published.wheels_in(Path(step.wheels))}
            return (
                bool(recorded)
                and present == set(recorded)
                and all(file_sha256(Path(step.wheels) / name) == sha for name, sha in recorded.items())
            )
        return True

    def prepare(self) -> None:
        """Before the command: what the step makes starts from nothing (a fresh checkout is for the command to
        create; a wheel directory exists, empty)."""
        step = self.step
        for directory in (step.fresh, step.wheels):
            if directory is not None:
                path = Path(directory)
                if directory == step.venv and os.path.lexists(path) and not _venv_recorded(step, self.setup):
                    self.setup.display.note(f"removed {path}: a venv this build did not make (made afresh)")
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                elif path.is_symlink() or path.exists():  # a file where the directory belongs
                    path.unlink()
                path.parent.mkdir(parents=True, exist_ok=True)
        if step.wheels is not None:
            Path(step.wheels).mkdir()

    def layers(self) -> tuple[Mapping[str, str], ...]:
        """The environment layers over the base environment (see torchkiln.process.environ)."""
        return (self.step.env,)

    def observer(self) -> LineObserver | None:
        """What reads the step's output as it arrives."""
        return None

    def environment(self, layer: Mapping[str, str] | None = None) -> dict[str, str]:
        """The command's process environment: the base, the kind's layers, then ``layer`` (a retry's jobs)."""
        layers = (*self.layers(), *((layer,) if layer else ()))
        return compose(self.setup.environ, *layers, path_prepend=self.step.path_prepend)

    def execute(self) -> Ran:
        """Run the command, streaming its output to its log; a failure is BuildFailed with the first error,
        the log's tail and the log's path."""
        done, observer = self.stream()
        return self.result(done, observer)

    def stream(self, layer: Mapping[str, str] | None = None) -> tuple[runner.Streamed, LineObserver | None]:
        """Run the command once (``layer`` over its environment), its output into its log and its observer."""
        step, setup = self.step, self.setup
        try:
            # a build step in its sandbox (torchkiln.build.sandbox); the log's header shows the step's own argv
            environment = self.environment(layer)
            with isolated(step, setup, self.record, step.argv, environment, step.cwd) as (argv, env):
                self.isolation = how(step, setup, self.record)
                # made last: a compile's phases are timed from here, as the step's duration is from its start
                observer = self.observer()
                done = runner.stream(
                    argv,
                    log=setup.step_log(step),
                    env=env,
                    cwd=step.cwd,
                    observe=observer,
                    redact=setup.redact,
                    header=f"# {step.name}: {' '.join(step.argv)}",
                )
        except runner.ProcessError as exc:
            raise BuildFailed(f"{step.name}: {exc}", step=step.name) from None
        return done, observer

    def result(self, done: runner.Streamed, observer: LineObserver | None) -> Ran:
        """A finished run as a success, or the BuildFailed (ConfigureMismatch) that says how it failed."""
        step, log = self.step, done.log
        mismatch = observer.verdict() if observer is not None else None
        if mismatch:
            assert observer is not None
            with log.open("a", encoding="utf-8") as handle:
                handle.write("# torchkiln: configure contradicts the recipe; build stopped\n")
            lines = "\n".join(f"  - {c}" for c in mismatch)
            raise ConfigureMismatch(
                f"{step.name}: {observer.stopped}:\n{lines}\nfull log: {log}",
                step=step.name,
                log=log,
            )
        if done.returncode != 0:
            raise BuildFailed(
                failure_message(step.name, done.returncode, done.seconds, log, where=_writes_to(step)),
                step=step.name,
                log=log,
            )
        phases = observer.phases() if observer is not None else None
        return Ran(done.seconds, log, done.tail, phases)

    def outputs(self, ran: Ran) -> dict[str, Any]:
        """What to record of a successful run (read back by :meth:`intact` and later steps)."""
        step = self.step
        # how it ran: sandboxed or not (a build step's)
        out: dict[str, Any] = {"isolation": self.isolation} if self.isolation is not None else {}
        if step.venv is not None:  # what the venv holds now: read back by intact() (_venv_as_recorded)
            out["venv"] = venv_distributions(Path(step.venv))
        if step.wheels is not None:
            built = published.wheels_in(Path(step.wheels))
            if not built:
                raise BuildFailed(
                    f"{step.name} finished but wrote no wheel into {step.wheels} (full log: {ran.log})",
                    step=step.name,
                    log=ran.log,
                )
            out["wheels"] = {p.name: file_sha256(p) for p in built}
        return out

    def settled_inputs(self, outputs: Mapping[str, Any]) -> dict[str, str] | None:
        """After a successful run, the inputs the step's fingerprint is recorded with when they differ from
        those taken before it (a compile whose tree outputs are known only afterwards); None: unchanged."""
        return None

    def verify(self, entry: Mapping[str, Any]) -> None:
        """After the step ran (and was recorded), was reused or was skipped: what must hold of its result."""


@dataclass(frozen=True)
class StepKind:
    """A kind of step: how the loop treats its steps, and the run (:class:`StepRun`) it starts for each."""

    name: str
    run: type[StepRun]
    optional: bool = False  # skipped altogether by --skip-postcheck
    always_runs: bool = False  # no fingerprint: runs on every build
    # ``--force`` runs it again although unchanged: what builds the wheels. Checkouts and environments are
    # keyed by their content (a fetch's pin, a venv's requirements) and reused: forcing them only costs.
    forced: bool = True
    # while its command runs, the post-build check's venvs are cloned from the store (build.warmcheck)
    warms: bool = False

    def start(
        self, step: Step, setup: BuildSetup, record: BuildRecord, stage: Stage | None = None
    ) -> StepRun:
        """The run of ``step`` in the build of ``setup`` (``stage``: its venv's store entry, begun early)."""
        return self.run(step, setup, record, stage)


ENV = StepKind("env", StepRun, forced=False)


def _files_digest(files: Iterable[Path]) -> str:
    """Files by name and sha256, in name order: what a step reads from a directory or a pattern."""
    return digest({p.name: file_sha256(p) for p in sorted(files)})


def _venv_recorded(step: Step, setup: BuildSetup) -> bool:
    """Whether a step on ``step``'s venv has a record in this work directory (the build made that venv)."""
    assert step.venv is not None
    return any(setup.state.get(name) is not None for name in setup.plan.venv_steps(step.venv))


def _venv_as_recorded(step: Step, setup: BuildSetup) -> bool:
    """Whether ``step``'s venv holds what the last recorded step on it left (its distributions): a venv changed
    outside the build (a ``pip install`` by hand) is made again, never built in or kept as the build's own.
    A record from before the venv was recorded (no ``venv`` output) cannot tell: made again too."""
    assert step.venv is not None
    recorded = None
    for name in reversed(setup.plan.venv_steps(step.venv)):
        entry = setup.state.get(name)
        if entry is not None:
            recorded = entry.get("outputs", {}).get("venv")
            break
    found = venv_distributions(Path(step.venv))
    if recorded == found:
        return True
    if isinstance(recorded, list):
        added = sorted(set(found) - set(recorded))
        gone = sorted(set(recorded) - set(found))
        change = "; ".join(
            part
            for part in (f"added {few(added)}" if added else "", f"removed {few(gone)}" if gone else "")
            if part
        )
        setup.display.note(f"{step.venv} changed since this build made it ({change}): made again")
    return False


def _writes_to(step: Step) -> str | None:
    """Where a step writes (what a full disk there would stop): its fresh directory, wheels, venv, output."""
    return step.fresh or step.wheels or step.venv or step.creates or step.cwd
