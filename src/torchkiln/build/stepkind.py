"""The base of every kind of step (:class:`StepKind`), and the ``env`` kind, which needs nothing more.

:class:`StepKind` implements what a step's declared data asks for, shared by every kind: ``fresh`` is emptied
before it runs, ``creates`` must still exist for it to count as done, ``reads`` are hashed into its
fingerprint, ``wheels`` is emptied before and must hold a wheel after, a ``venv`` must still hold what the
build installed in it, and the environment store's hooks (``store_key`` to ``stage``) keep and reuse the venv
of a step that makes or changes one (:mod:`torchkiln.build.envstore`). The other kinds subclass it, each in
its family's module; :data:`torchkiln.build.kinds.KINDS` maps each kind's name to it.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from torchkiln.artifacts import dist
from torchkiln.errors import (
    SPACE_ERRORS,
    BuildFailed,
    ConfigureMismatch,
    describe_os_error,
    few,
)
from torchkiln.plan.model import Step
from torchkiln.process import runner
from torchkiln.process.environ import compose

from .context import Context, Ran, failure_message
from .envstore import EnvStore, Restored, interpreter_identity, tree_bytes, venv_distributions
from .fingerprint import digest, file_sha256
from .observers import LineObserver
from .sandbox import isolated
from .sandbox import record as isolation_record


class StepKind:
    """A kind of step. The defaults implement what a step's declared data asks for."""

    name: ClassVar[str] = ""
    optional: ClassVar[bool] = False  # skipped altogether by --skip-checks
    always_runs: ClassVar[bool] = False  # no fingerprint: runs on every build
    # ``--force`` runs it again although unchanged: what builds the wheels. Checkouts and environments are
    # keyed by their content (a fetch's pin, a venv's requirements) and reused: forcing them only costs.
    forced: ClassVar[bool] = True

    def inputs(self, step: Step, ctx: Context) -> dict[str, str]:
        """What the step's result depends on besides its argv, env, cwd and the steps before it: the content
        of what it reads (a file's sha256; a directory's wheels, each by name and sha256)."""
        found: dict[str, str] = {}
        for name in step.reads:
            path = Path(name)
            if "*" in path.name:  # a pattern: the files it matches, each by name and sha256
                found[name] = _files_digest(path.parent.glob(path.name))
            elif path.is_file():
                found[name] = file_sha256(path)
            elif path.is_dir():
                found[name] = _files_digest(dist.wheels_in(path))
        return found

    def intact(self, step: Step, entry: Mapping[str, Any], ctx: Context) -> bool:
        """Whether what the step left last time is still there (else it runs again). A venv must still hold
        what the build installed in it (:func:`_venv_as_recorded`)."""
        if step.creates is not None and not Path(step.creates).exists():
            return False
        if step.venv is not None and not _venv_as_recorded(step, ctx):
            return False
        if step.wheels is not None:
            # exactly the wheels it made: a wheel dropped in beside them (pip would pick from them, the
            # checks would install it) makes the step run again, from an empty directory
            recorded = entry.get("outputs", {}).get("wheels", {})
            present = {p.name for p in dist.wheels_in(Path(step.wheels))}
            return (
                bool(recorded)
                and present == set(recorded)
                and all(file_sha256(Path(step.wheels) / name) == sha for name, sha in recorded.items())
            )
        return True

    def prepare(self, step: Step, ctx: Context) -> None:
        """Before the command: what the step makes starts from nothing (a fresh checkout is for the command to
        create; a wheel directory exists, empty)."""
        for directory in (step.fresh, step.wheels):
            if directory is not None:
                path = Path(directory)
                if directory == step.venv and os.path.lexists(path) and not _venv_recorded(step, ctx):
                    ctx.display.note(f"removed {path}: a venv this build did not make (made afresh)")
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                elif path.is_symlink() or path.exists():  # a file where the directory belongs
                    path.unlink()
                path.parent.mkdir(parents=True, exist_ok=True)
        if step.wheels is not None:
            Path(step.wheels).mkdir()

    def layers(self, step: Step, ctx: Context) -> tuple[Mapping[str, str], ...]:
        """The environment layers over the base environment (see torchkiln.process.environ)."""
        return (step.env,)

    def observer(self, step: Step, ctx: Context) -> LineObserver | None:
        """What reads the step's output as it arrives."""
        return None

    def environment(self, step: Step, ctx: Context, layer: Mapping[str, str] | None = None) -> dict[str, str]:
        """The command's process environment: the base, the kind's layers, then ``layer`` (a retry's jobs)."""
        layers = (*self.layers(step, ctx), *((layer,) if layer else ()))
        return compose(ctx.environ, *layers, path_prepend=step.path_prepend)

    def execute(self, step: Step, ctx: Context) -> Ran:
        """Run the command, streaming its output to its log; a failure is BuildFailed with the first error,
        the log's tail and the log's path."""
        done, observer = self.stream(step, ctx)
        return self.result(step, done, observer)

    def stream(
        self, step: Step, ctx: Context, layer: Mapping[str, str] | None = None
    ) -> tuple[runner.Streamed, LineObserver | None]:
        """Run the command once (``layer`` over its environment), its output into its log and its observer."""
        try:
            # a build step in its sandbox (torchkiln.build.sandbox); the log's header shows the step's own argv
            with isolated(step, ctx, step.argv, self.environment(step, ctx, layer), step.cwd) as (argv, env):
                # made last: a compile's phases are timed from here, as the step's duration is from its start
                observer = self.observer(step, ctx)
                done = runner.stream(
                    argv,
                    log=ctx.step_log(step),
                    env=env,
                    cwd=step.cwd,
                    observe=observer,
                    redact=ctx.redact,
                    header=f"# {step.name}: {' '.join(step.argv)}",
                )
        except runner.ProcessError as exc:
            raise BuildFailed(f"{step.name}: {exc}", step=step.name) from None
        return done, observer

    def result(self, step: Step, done: runner.Streamed, observer: LineObserver | None) -> Ran:
        """A finished run as a success, or the BuildFailed (ConfigureMismatch) that says how it failed."""
        log = done.log
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

    def outputs(self, step: Step, ran: Ran, ctx: Context) -> dict[str, Any]:
        """What to record of a successful run (read back by :meth:`intact` and later steps)."""
        out: dict[str, Any] = dict(isolation_record(step, ctx))  # how it ran: sandboxed or not
        if step.venv is not None:  # what the venv holds now: read back by intact() (_venv_as_recorded)
            out["venv"] = venv_distributions(Path(step.venv))
        if step.wheels is not None:
            built = dist.wheels_in(Path(step.wheels))
            if not built:
                raise BuildFailed(
                    f"{step.name} finished but wrote no wheel into {step.wheels} (full log: {ran.log})",
                    step=step.name,
                    log=ran.log,
                )
            out["wheels"] = {p.name: file_sha256(p) for p in built}
        return out

    def settled_inputs(self, step: Step, ctx: Context, outputs: Mapping[str, Any]) -> dict[str, str] | None:
        """After a successful run, the inputs the step's fingerprint is recorded with when they differ from
        those taken before it (a compile whose tree outputs are known only afterwards); None: unchanged."""
        return None

    def verify(self, step: Step, entry: Mapping[str, Any], ctx: Context) -> None:
        """After the step ran (and was recorded) or was skipped: what must hold of its result."""

    # The environment store (torchkiln.build.envstore): steps that make or change a venv (``Step.venv``).

    def store_key(self, step: Step, ctx: Context, inputs: Mapping[str, str]) -> str | None:
        """The step's key in the environment store: what is in its venv after it, without this work
        directory's paths (so another work directory finds it). None: not kept (no venv, no store, or the
        step before it on the venv has no key)."""
        if step.venv is None or ctx.env_store is None:
            return None
        chain = ctx.plan.venv_steps(step.venv)
        position = chain.index(step.name)
        previous = ctx.env_keys.get(chain[position - 1]) if position else ""
        if not position and step.clones:  # a clone holds what the venv it clones held: that venv's key
            cloned = ctx.plan.venv_steps(step.clones)
            previous = ctx.env_keys.get(cloned[-1]) if cloned else ""
        if previous is None:
            return None
        local = _localizer(ctx)
        return ctx.env_store.key(
            {
                "step": step.name,
                "argv": [local(a) for a in step.argv],
                "env": {k: local(v) for k, v in step.shown_env.items()},
                "cwd": local(step.cwd) if step.cwd else None,
                "inputs": {local(k): v for k, v in inputs.items()},
                "previous": previous,
                "host": interpreter_identity(f"python{step.python or ctx.plan.recipe.python}", ctx.environ),
            }
        )

    def reuse(
        self, step: Step, ctx: Context, key: str | None, replaced: Callable[[], bool] = lambda: False
    ) -> Restored | None:
        """Instead of running the step: its venv cloned from the store, when the store has its key. When
        ``replaced()`` says the next step's entry replaces the venv at once (asked after this entry's files,
        which the next step may read, are in place), only the files are copied."""
        if key is None or ctx.env_store is None or step.venv is None:
            return None
        try:
            found = ctx.env_store.restore(key, Path(step.venv), kept_files(step), clone=False)
            if found is None:
                # a step whose venv is not kept (Step.stored): the next step's entry, when the store has
                # it, replaces the venv: nothing to restore for this one
                unkept = not step.stored and not kept_files(step) and replaced()
                return Restored({}, 0.0, ctx.env_store.root, "", cloned=False) if unkept else None
            if replaced():
                return found
            cloned = ctx.env_store.clone(found, Path(step.venv))
            ctx.warming.cloned(step.venv, cloned.entry / "venv", cloned.kept_from)  # build.warmcheck
            return cloned
        except OSError as exc:
            # The venv may be half cloned: every step on it runs again next time.
            for name in ctx.plan.venv_steps(step.venv):
                ctx.state.forget(name)
            entry = ctx.env_store.root / key
            if (
                errno.errorcode.get(exc.errno or 0) in SPACE_ERRORS
            ):  # the work directory's disk, not the store
                needed = tree_bytes(entry / "venv")
                raise BuildFailed(
                    f"{step.name}: cloning {step.venv} from the environment store: "
                    f"{describe_os_error(exc, path=step.venv, needed=needed)}",
                    step=step.name,
                ) from None
            raise BuildFailed(
                f"{step.name}: could not clone {step.venv} from the environment store ({entry}): "
                f"{describe_os_error(exc)}; or remove that entry, or build with --env-store off",
                step=step.name,
            ) from None

    def keepable(self, step: Step, ctx: Context, key: str | None) -> bool:
        """Whether the step's venv is kept in the store after it ran: only when this run made that venv from
        nothing (the venv step ran, or the venv was cloned from the store, in this run: a venv an earlier run
        left may hold what no key says, a hand-made ``pip install``), and no later step on the same venv has
        run before in this work directory (the venv would hold more than this step's key says)."""
        if key is None or ctx.env_store is None or step.venv is None or not step.stored:
            return False
        chain = ctx.plan.venv_steps(step.venv)
        made_now = step.name == chain[0] or any(
            r.name == chain[0] and r.status in ("ran", "reused") for r in ctx.records
        )
        later = chain[chain.index(step.name) + 1 :]
        return made_now and not any(ctx.state.get(name) is not None for name in later)

    def keep(self, step: Step, ctx: Context, key: str | None, outputs: Mapping[str, Any]) -> None:
        """After the step ran: its venv kept in the store when :meth:`keepable` (what was staged while it ran
        completed, else cloned now). A store that cannot be written costs the next work directory a rebuild,
        never this build: one note."""
        staged = ctx.staged.pop(step.name, None)
        if not self.keepable(step, ctx, key):
            EnvStore.discard(staged)
            return
        assert key is not None and ctx.env_store is not None and step.venv is not None
        try:
            if staged is not None:
                ctx.env_store.commit(key, staged, Path(step.venv), kept_files(step), step.name, outputs)
            else:
                ctx.env_store.keep(key, Path(step.venv), kept_files(step), step.name, outputs)
        except OSError as exc:
            ctx.display.note(
                f"environment store {ctx.env_store.root}: could not keep {step.venv} (this build goes on; "
                f"the next work directory makes it again): {describe_os_error(exc)}"
            )

    def stage(self, step: Step, ctx: Context) -> Path | None:
        """The store's entry for the step's venv begun while the step still runs (:meth:`EnvStore.stage`);
        None when it will not be kept or cannot be staged (:meth:`keep` then tries again, and says why)."""
        key = ctx.env_keys.get(step.name)
        if not self.keepable(step, ctx, key) or ctx.env_store is None or step.venv is None or key is None:
            return None
        try:
            return ctx.env_store.stage(key, Path(step.venv))
        except OSError:
            return None


class EnvKind(StepKind):
    name = "env"
    forced = False


def _files_digest(files: Iterable[Path]) -> str:
    """Files by name and sha256, in name order: what a step reads from a directory or a pattern."""
    return digest({p.name: file_sha256(p) for p in sorted(files)})


def _venv_recorded(step: Step, ctx: Context) -> bool:
    """Whether a step on ``step``'s venv has a record in this work directory (the build made that venv)."""
    assert step.venv is not None
    return any(ctx.state.get(name) is not None for name in ctx.plan.venv_steps(step.venv))


def _venv_as_recorded(step: Step, ctx: Context) -> bool:
    """Whether ``step``'s venv holds what the last recorded step on it left (its distributions): a venv changed
    outside the build (a ``pip install`` by hand) is made again, never built in or kept as the build's own.
    A record from before the venv was recorded (no ``venv`` output) cannot tell: made again too."""
    assert step.venv is not None
    recorded = None
    for name in reversed(ctx.plan.venv_steps(step.venv)):
        entry = ctx.state.get(name)
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
        ctx.display.note(f"{step.venv} changed since this build made it ({change}): made again")
    return False


def kept_files(step: Step) -> dict[str, Path]:
    """What an env step leaves outside its venv (the constraints file), kept with it in the store."""
    if step.creates is None or step.venv is None or Path(step.creates).is_relative_to(step.venv):
        return {}
    return {Path(step.creates).name: Path(step.creates)}


def _localizer(ctx: Context) -> Callable[[str], str]:
    """Takes this build's own paths (work directory, dist/, source trees) out of a string, so the same
    environment at another path has the same store key."""
    paths = ctx.plan.paths
    names = {str(paths.workdir): "{workdir}", str(paths.dist): "{dist}"}
    names.update({str(s.path): f"{{source:{s.name}}}" for s in ctx.plan.sources})
    ordered = sorted(names.items(), key=lambda item: len(item[0]), reverse=True)

    def local(text: str) -> str:
        for path, name in ordered:
            text = text.replace(path, name)
        return text

    return local


def _writes_to(step: Step) -> str | None:
    """Where a step writes (what a full disk there would stop): its fresh directory, wheels, venv, output."""
    return step.fresh or step.wheels or step.venv or step.creates or step.cwd
