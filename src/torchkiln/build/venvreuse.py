"""The environment store around the steps of one build: a step that makes or changes a venv (``Step.venv``)
is restored from the store when another work directory kept the same venv, and its venv is kept there after
it ran (:mod:`torchkiln.build.envstore`); the post-build check's venv is cloned from the store while the
compile runs (:mod:`torchkiln.build.warmcheck`).

One :class:`VenvReuse` per build, which the loop (:mod:`torchkiln.build.loop`) consults around each step; no
kind knows of the store. It holds what the build learns of its venvs: each step's key, the venvs made again
in this run, the records of steps reused without their clone, the runs the step before took inputs of, the
venvs and entries found sound.

A venv the build relies on is checked against its RECORDs first (issue 47, :mod:`torchkiln.build.venvcheck`):
an entry before it is cloned (one found damaged is dropped), a venv an earlier run left before a step that
runs uses it (installs into it, clones it, runs its python or tools). A damaged venv is made again from the
store's entry for what it should hold, when that entry is sound, else from scratch: :class:`DamagedVenv`
makes the loop start over with that venv's steps forgotten. Either way the build says so in one line. A
no-op uses no venv, and checks none.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torchkiln.errors import SPACE_ERRORS, BuildFailed, describe_os_error, mount_point
from torchkiln.plan.model import Step
from torchkiln.plan.records import Records
from torchkiln.process.runner import in_context

from .context import BuildRecord, BuildSetup
from .earlycheck import EarlyStart
from .envstore import (
    EnvStore,
    Restored,
    interpreter_identity,
    linked_origin,
    materialize,
    tree_bytes,
    venv_distributions,
)
from .stepkind import StepKind, StepRun
from .venvcheck import damage
from .warmcheck import Warming


class DamagedVenv(Exception):
    """A venv the build relies on is damaged and the store has no sound entry for it: its steps run again
    (the loop starts over with them forgotten). ``line``: what is damaged, the one line the build says."""

    def __init__(self, venv: str, line: str, step: str) -> None:
        super().__init__(line)
        self.venv, self.line, self.step = venv, line, step


class VenvReuse:
    """The environment store's part in one build (see the module's docstring)."""

    def __init__(
        self,
        setup: BuildSetup,
        record: BuildRecord,
        kinds: Mapping[str, StepKind],
    ) -> None:
        self.setup, self.record, self.kinds = setup, record, kinds
        self.keys: dict[str, str] = {}  # step -> its key in the store, this run
        # venvs that a step made or changed in this run: the later steps on them run (or are reused) again
        self.remade: set[str] = set()
        # venv -> steps reused without their clone (the next step's entry replaced it), recorded with that step
        self.deferred: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        # step -> its run and inputs, taken early by the step before it (whether its entry replaces that venv)
        self.ahead: dict[str, tuple[StepRun, dict[str, str]]] = {}
        # venvs cloned from the store and unchanged since, and check venvs cloned while a compile runs
        # (and the check started in those: build.earlycheck)
        self.warming = Warming(early=EarlyStart(setup, record, kinds))
        # venvs whose content this run made, restored or checked (torchkiln.build.venvcheck): not checked again
        self.sound: set[str] = set()
        self.entries: dict[str, str | None] = {}  # store key -> what is wrong with its entry (None: sound)
        self.baselines: dict[str, threading.Thread] = {}  # venv -> its files being recorded as sound

    # -- the runs --------------------------------------------------------------------------------------

    def start(self, step: Step) -> StepRun:
        """The run of ``step`` in this build, its venv's store entry staged through :meth:`stage`."""
        kind = self.kinds[step.kind]
        return kind.start(step, self.setup, self.record, functools.partial(self.stage, step))

    def begin(self, step: Step) -> tuple[StepRun, dict[str, str] | None]:
        """``step``'s run and its inputs when the step before it took them (:meth:`_replaced_next`), else a
        new run and None."""
        self.warming.join(step.venv)  # a warm clone at the check venv's path goes back before anything looks
        return self.ahead.pop(step.name, None) or (self.start(step), None)

    # -- around each step ------------------------------------------------------------------------------

    def key(self, step: Step, inputs: Mapping[str, str]) -> str | None:
        """The step's key in the environment store (:meth:`_key`), kept for the steps after it on its venv."""
        key = self._key(step, inputs)
        if key is not None:
            self.keys[step.name] = key
        return key

    def _key(self, step: Step, inputs: Mapping[str, str]) -> str | None:
        """What is in the step's venv after it, without this work directory's paths (so another work
        directory finds it). None: not kept (no venv, no store, or the step before it on the venv has no
        key)."""
        setup = self.setup
        if step.venv is None or setup.env_store is None:
            return None
        chain = setup.plan.venv_steps(step.venv)
        position = chain.index(step.name)
        previous = self.keys.get(chain[position - 1]) if position else ""
        if not position and step.clones:  # a clone holds what the venv it clones held: that venv's key
            cloned = setup.plan.venv_steps(step.clones)
            previous = self.keys.get(cloned[-1]) if cloned else ""
        if previous is None:
            return None
        local = _localizer(setup)
        return setup.env_store.key(
            {
                "step": step.name,
                "argv": [local(a) for a in step.argv],
                "env": {k: local(v) for k, v in step.shown_env.items()},
                "cwd": local(step.cwd) if step.cwd else None,
                "inputs": {local(k): v for k, v in inputs.items()},
                "previous": previous,
                "host": interpreter_identity(
                    f"python{step.python or setup.plan.recipe.python}", setup.environ
                ),
            }
        )

    def made_again(self, step: Step) -> bool:
        """Whether an earlier step made ``step``'s venv again in this run (it no longer holds what this step
        put in it)."""
        return step.venv in self.remade

    def remake(self, step: Step) -> None:
        """``step`` runs or is restored: its venv is made again."""
        if step.venv is not None:
            self.remade.add(step.venv)

    def restore(self, step: Step, index: int, key: str | None) -> Restored | None:
        """Instead of running the step: its venv cloned from the store, when the store has its key and the
        entry is sound. When the next step's entry replaces the venv at once (asked after this entry's files,
        which the next step may read, are in place), only the files are copied."""
        store = self.setup.env_store
        if key is None or store is None or step.venv is None:
            return None
        replaced = functools.partial(self._replaced_next, index)
        try:
            found = store.restore(key, Path(step.venv), kept_files(step), clone=False)
            if found is None:
                # a step whose venv is not kept (Step.stored): the next step's entry, when the store has
                # it, replaces the venv: nothing to restore for this one
                unkept = not step.stored and not kept_files(step) and replaced()
                return Restored({}, 0.0, store.root, "", cloned=False) if unkept else None
            if replaced():
                return found
            started = time.monotonic()
            problem = self._entry_problem(step, key)
            if problem is not None:
                if self.deferred.get(step.venv):  # the steps before it were reused for this entry alone
                    raise DamagedVenv(step.venv, problem, step.name)
                self.setup.display.note(f"{problem}: {step.name} runs")
                return None
            checked = dataclasses.replace(found, seconds=found.seconds + time.monotonic() - started)
            cloned = store.clone(checked, Path(step.venv))  # its seconds: the check's and the clone's
            self.warming.cloned(step.venv, cloned.entry / "venv", cloned.kept_from)  # build.warmcheck
            self.sound.add(step.venv)
            return cloned
        except OSError as exc:
            raise self._unclonable(step, store.root / key, exc) from None

    def _unclonable(self, step: Step, entry: Path, exc: OSError) -> BuildFailed:
        """A venv that could not be cloned may be half cloned: every step on it runs again next time."""
        assert step.venv is not None
        for name in self.setup.plan.venv_steps(step.venv):
            self.setup.state.forget(name)
        if errno.errorcode.get(exc.errno or 0) in SPACE_ERRORS:  # the work directory's disk, not the store
            needed = tree_bytes(entry / "venv")
            return BuildFailed(
                f"{step.name}: cloning {step.venv} from the environment store: "
                f"{describe_os_error(exc, path=step.venv, needed=needed)}",
                step=step.name,
            )
        return BuildFailed(
            f"{step.name}: could not clone {step.venv} from the environment store ({entry}): "
            f"{describe_os_error(exc)}; or remove that entry, or build with --env-store off",
            step=step.name,
        )

    def _replaced_next(self, index: int) -> bool:
        """Whether the step after ``index`` is on the same venv and will be reused from the store: then cloning
        this step's venv is wasted (that one replaces it). Its run and inputs, taken here, are kept for its
        turn (:meth:`begin`)."""
        setup = self.setup
        plan = setup.plan
        if index + 1 >= len(plan.steps) or setup.env_store is None:
            return False
        step, following = plan.steps[index], plan.steps[index + 1]
        kind = self.kinds[following.kind]
        if following.venv is None or following.venv != step.venv:
            return False
        if (kind.optional and setup.options.skip_postcheck) or (setup.options.force and kind.forced):
            return False
        run = self.start(following)
        inputs = run.inputs()
        self.ahead[following.name] = (run, inputs)
        key = self._key(following, inputs)  # kept at its turn, as every step's
        return key is not None and setup.env_store.lookup(key, kept_files(following)) is not None

    def _entry_problem(self, step: Step, key: str) -> str | None:
        """None when the store's entry for ``key`` holds what it was kept with: the distributions its step
        recorded, each file as its RECORD says (:func:`torchkiln.build.venvcheck.damage`); else what is
        wrong, in a line (the entry is dropped). Asked once per entry in a build."""
        store = self.setup.env_store
        if key not in self.entries:
            found = store.lookup(key, kept_files(step)) if store is not None else None
            if found is None:
                self.entries[key] = "the environment store has no entry for it"
                return self.entries[key]
            venv = found[0] / "venv"
            recorded = found[1].get("outputs", {}).get("venv")
            now = venv_distributions(venv)
            if isinstance(recorded, list) and recorded != now:
                differ = ", ".join(sorted(set(now) ^ set(recorded)))
                problem: str | None = f"{venv} differs from the distributions it was kept with ({differ})"
            else:
                damaged = damage(venv, self.records())
                problem = damaged.line() if damaged is not None else None
            if problem is not None:
                problem = f"dropped the environment store's entry of {step.name}: {problem}"
                assert store is not None
                store.drop(key)
            self.entries[key] = problem
        return self.entries[key]

    def records(self) -> Records:
        """Where the build's venv checks keep what they found (the work directory's and the store's)."""
        plan = self.setup.plan
        return Records.for_build(plan.paths.workdir, plan.env_store)

    def save(self, step: Step, entry: dict[str, Any], *, deferred: bool = False) -> None:
        """Record a step as done. A step reused without cloning its venv (the next step's entry replaced it) is
        recorded with the next step that leaves the venv whole: a build that stops between them runs both
        again."""
        if deferred and step.venv is not None:
            self.deferred.setdefault(step.venv, []).append((step.name, entry))
            return
        for name, earlier in self.deferred.pop(step.venv, []) if step.venv is not None else []:
            self.setup.state.record(name, earlier)
        self.setup.state.record(step.name, entry)

    def keepable(self, step: Step, key: str | None) -> bool:
        """Whether the step's venv is kept in the store after it ran: only when this run made that venv from
        nothing (the venv step ran, or the venv was cloned from the store, in this run: a venv an earlier run
        left may hold what no key says, a hand-made ``pip install``), and no later step on the same venv has
        run before in this work directory (the venv would hold more than this step's key says)."""
        setup = self.setup
        if key is None or setup.env_store is None or step.venv is None or not step.stored:
            return False
        chain = setup.plan.venv_steps(step.venv)
        made_now = step.name == chain[0] or any(
            r.name == chain[0] and r.status in ("ran", "reused") for r in self.record.steps
        )
        later = chain[chain.index(step.name) + 1 :]
        return made_now and not any(setup.state.get(name) is not None for name in later)

    def keep(self, step: Step, key: str | None, outputs: Mapping[str, Any], staged: Path | None) -> None:
        """After the step ran: its venv kept in the store when :meth:`keepable` (``staged``, what was staged
        while it ran, completed; else the venv itself moved there when :meth:`adoptable`; else cloned now),
        and its files recorded as sound (:meth:`_baseline`). A
        store that cannot be written costs the next work directory a rebuild, never this build: one note."""
        store = self.setup.env_store
        if step.venv is not None:
            self.sound.add(step.venv)
        if not self.keepable(step, key):
            EnvStore.discard(staged)
        else:
            assert key is not None and store is not None and step.venv is not None
            try:
                if staged is not None:
                    store.commit(key, staged, Path(step.venv), kept_files(step), step.name, outputs)
                elif not self.adoptable(step) or (
                    store.adopt(key, Path(step.venv), kept_files(step), step.name, outputs) is None
                ):
                    store.keep(key, Path(step.venv), kept_files(step), step.name, outputs)
            except OSError as exc:
                self.setup.display.note(
                    f"environment store {store.root}: could not keep {step.venv} (this build goes on; "
                    f"the next work directory makes it again): {describe_os_error(exc)}"
                )
        self._baseline(step)

    def _baseline(self, step: Step) -> None:
        """The venv as the step left it, its files' identities recorded as sound (what the next check of it
        compares with), in a thread beside the steps after it; not when the next step changes it again."""
        plan = self.setup.plan
        names = [s.name for s in plan.steps]
        following = names.index(step.name) + 1
        if step.venv is None or (following < len(names) and plan.steps[following].venv == step.venv):
            return
        venv, records = Path(step.venv), self.records()

        def record() -> None:
            try:
                damage(venv, records, trust=True)
            except OSError:
                pass  # the next check hashes what it cannot compare

        thread = threading.Thread(target=in_context(record), name="venv-baseline", daemon=True)
        self.baselines[step.venv] = thread
        thread.start()

    def stage(self, step: Step) -> Path | None:
        """The store's entry for the step's venv begun while the step still runs (:meth:`EnvStore.stage`);
        None when it will not be kept or cannot be staged (:meth:`keep` then tries again, and says why)."""
        key = self.keys.get(step.name)
        store = self.setup.env_store
        if not self.keepable(step, key) or store is None or step.venv is None or key is None:
            return None
        try:
            if self.adoptable(step):  # kept by a move after the step: its large files shared meanwhile
                store.share(Path(step.venv))
                return None
            return store.stage(key, Path(step.venv))
        except OSError:
            return None

    def adoptable(self, step: Step) -> bool:
        """Whether the step's venv is kept by moving it into the store (:meth:`EnvStore.adopt`), not by a
        clone: no later step of the plan uses it (the post-build check's venv), and the store is on its
        filesystem."""
        store, venv = self.setup.env_store, step.venv
        if store is None or venv is None:
            return False
        steps = self.setup.plan.steps
        later = steps[[s.name for s in steps].index(step.name) + 1 :]
        if any(s.venv == venv or venv in self._used(s) for s in later):  # _used: installs, clones, names
            return False
        try:  # a rename crosses no mount point (a bind mount of the same filesystem is one)
            return mount_point(store.root) == mount_point(Path(venv).parent)
        except OSError:
            return False

    # -- the check venv's warm clone (build.warmcheck) -------------------------------------------------

    def before_run(self, step: Step) -> None:
        """``step`` is about to run: each venv it relies on that this run did not make is checked (a damaged
        one made again: :meth:`_check`); its own venv is no longer what the store entry it was cloned from
        holds (a warm clone of it is dropped; a venv linked to the entry gets files of its own), and its own
        warm clone, when one was started, is whole or gone."""
        used = self._used(step)
        for venv in {*used, *([step.venv] if step.venv else [])}:
            recording = self.baselines.pop(venv, None)
            if recording is not None:
                recording.join()
        for venv in used:
            if venv not in self.sound:
                self._check(step, venv)
        if step.venv is not None:
            self.warming.changed(step.venv)
            own = linked_origin(Path(step.venv)) if step.fresh != step.venv else None
            if own is not None:
                try:
                    materialize(Path(step.venv))
                except OSError as exc:
                    raise self._unclonable(step, own[0].parent, exc) from None
            if self._linked_origin(step.clones):  # cloned by torchkiln, outside the sandbox
                self.warming.start([step])
            self.warming.join(step.venv)
            self.warming.settle(step)

    def _linked_origin(self, venv: str | None) -> bool:
        """``venv``, linked to its store entry by an earlier run and with no origin in this one, given that
        entry as its origin (it is the entry unchanged: a step that installs into it makes it a venv of its own
        first); True when it was."""
        if venv is None or venv in self.warming.origins:
            return False
        linked = linked_origin(Path(venv))
        if linked is not None:
            self.warming.cloned(venv, *linked)
        return linked is not None

    def _used(self, step: Step) -> list[str]:
        """The plan's venvs ``step`` relies on: the one it installs into (not one it makes afresh), the one it
        clones, and any its command or variables name (its python, its tools on PATH, VIRTUAL_ENV)."""
        named = [*step.argv, *step.path_prepend, *step.env.values()]
        used = []
        for venv in sorted({s.venv for s in self.setup.plan.steps if s.venv is not None}):
            if venv == step.venv:
                relies = step.fresh != venv
            else:
                relies = venv == step.clones or any(t == venv or venv + "/" in t for t in named)
            if relies:
                used.append(venv)
        return used

    def _check(self, step: Step, venv: str) -> None:
        """``venv`` checked against its RECORDs; a damaged one made again from the store's entry for what it
        holds now (sound), else removed, :class:`DamagedVenv` (its steps run again)."""
        found = damage(Path(venv), self.records())
        if found is None:
            self.sound.add(venv)
            return
        plan, store = self.setup.plan, self.setup.env_store
        order = [s.name for s in plan.steps]
        before = [n for n in plan.venv_steps(venv) if order.index(n) < order.index(step.name)]
        last = plan.steps[order.index(before[-1])] if before else None
        key = self.keys.get(last.name) if last is not None else None
        problem = self._entry_problem(last, key) if last is not None and key is not None else None
        if last is not None and key is not None and store is not None and problem is None:
            try:
                restored = store.restore(key, Path(venv), kept_files(last))
            except OSError as exc:
                raise self._unclonable(last, store.root / key, exc) from None
            if restored is not None:
                self.warming.cloned(venv, restored.entry / "venv", restored.kept_from)
                self.sound.add(venv)
                self.setup.display.note(f"{found.line()}: made again from the environment store")
                return
        dropped = (
            " (and the store's entry for it, dropped)" if problem and problem.startswith("dropped") else ""
        )
        raise DamagedVenv(venv, found.line() + dropped, step.name)

    def forget(self, venv: str) -> None:
        """A damaged venv removed and its steps forgotten: the next pass runs (or restores) them again."""
        for name in self.setup.plan.venv_steps(venv):
            self.setup.state.forget(name)
        shutil.rmtree(venv, ignore_errors=True)

    def while_running(self, kind: StepKind) -> None:
        """Before the command of a step whose kind ``warms``: the check venvs cloned meanwhile, from a build
        venv an earlier run linked to its store entry (a rebuild where it was built) too."""
        if not kind.warms or self.setup.options.skip_postcheck:
            return
        for step in self.setup.plan.steps:
            self._linked_origin(step.clones)
        self.warming.start(self.setup.plan.steps)

    def passed(self, step: Step) -> None:
        """``step`` was skipped or reused: a warm clone of its venv is of no use."""
        self.warming.drop(step.venv)

    def finish(self) -> None:
        """The build ends: a warm check venv no step took is removed, the venvs' files are recorded."""
        self.warming.finish()
        for thread in self.baselines.values():
            thread.join()
        self.baselines.clear()


def kept_files(step: Step) -> dict[str, Path]:
    """What an env step leaves outside its venv (the constraints file), kept with it in the store."""
    if step.creates is None or step.venv is None or Path(step.creates).is_relative_to(step.venv):
        return {}
    return {Path(step.creates).name: Path(step.creates)}


def _localizer(setup: BuildSetup) -> Callable[[str], str]:
    """Takes this build's own paths (work directory, dist/, source trees) out of a string, so the same
    environment at another path has the same store key."""
    paths = setup.plan.paths
    names = {str(paths.workdir): "{workdir}", str(paths.dist): "{dist}"}
    names.update({str(s.path): f"{{source:{s.name}}}" for s in setup.plan.sources})
    ordered = sorted(names.items(), key=lambda item: len(item[0]), reverse=True)

    def local(text: str) -> str:
        for path, name in ordered:
            text = text.replace(path, name)
        return text

    return local
