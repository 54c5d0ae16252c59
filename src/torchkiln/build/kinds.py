"""What the builder does around each kind of step: one class per kind, chosen by ``Step.kind``.

The plan (:mod:`torchkiln.plan.make`) says what runs and declares what each step leaves behind and reads; a
:class:`StepKind` turns that into behaviour, and :data:`KINDS` maps each kind to its class. The builder
(:mod:`torchkiln.build.loop`) is a loop that asks the step's kind, never the step's name:

=========  =====================================================================================================
kind       behaviour around the command
=========  =====================================================================================================
fetch      the first step of a checkout starts from an empty directory; the steps are a chain, done only while
           the checkout is intact (a damaged one starts over);
           the step that leaves it at its ref checks HEAD against the recipe's pin, refuses a checkout that
           is not the commit's tree plus the build's own outputs (torchkiln.build.treeguard; also when
           skipped; ``--allow-dirty`` lets it through) and a tree whose version is not the wheel's label
           (torchkiln.build.treelabel)
env        venvs and requirements: requirement files' contents are inputs; a venv that vanished, or holds other
           distributions than the last step on it left, is made again
compile    the source tree's identity (without the files the build writes into it) is an input; before it runs, the
           tree's version must be the wheel's label and a fetched tree its commit's tree plus the build's own
           outputs; what it writes into the tree is recorded as its own (torchkiln.build.treeguard);
           ``SOURCE_DATE_EPOCH`` comes from the source; ``--force`` removes its in-tree build directories
           (``scratch``), a changed configuration their CMake cache (torchkiln.build.reconfigure), and a file
           where the build directory belongs; the compiler cache session (opened before the first compile
           that runs) adds its layers to the environment; live progress, phases and the configure watcher
           read the output (torch's CMake summary, torchvision's setup.py lines); the tools it used are recorded;
           it must leave a wheel
package    rewrites wheels an earlier step made (the torchvision bundling): the wheels it reads are an input; its
           own wheel directory then holds the project's final wheels (what the checks install, publish copies)
checks     skipped with ``--skip-checks``; a step whose output ends with the wheels' build facts is compared
           with the recipe (also when skipped: the recipe may have changed)
publish    in-process, every run: closes the cache session, applies ``--min-cache-hit-rate``, copies the wheels
           into dist/ atomically, writes the lock file and the manifest
=========  =====================================================================================================

Behaviour that belongs to a step's *data* is shared by every kind (:class:`StepKind`): ``fresh`` is emptied
before it runs, ``creates`` must still exist for it to count as done, ``reads`` are hashed into its
fingerprint, ``wheels`` is emptied before and must hold a wheel after. A new kind is a subclass and a row
in :data:`KINDS` (and the kind's name in :data:`torchkiln.plan.model.Kind`).

Seams for later work: :class:`~torchkiln.build.context.Context` is what a kind may use; a host preflight (issue 11)
reads the plan before the loop; per-run cache statistics come from ``Context.cache`` (issue 14).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from torchkiln.artifacts import dist, jsonfile
from torchkiln.artifacts.manifest import CheckResult, Checks
from torchkiln.errors import (
    SPACE_ERRORS,
    BuildFailed,
    ConfigureMismatch,
    describe_os_error,
    few,
)
from torchkiln.plan.model import Source, Step
from torchkiln.plan.records import Records
from torchkiln.process import runner
from torchkiln.process.environ import compose
from torchkiln.source.git import (
    check_pin,
    checkout_intact,
    dirty_checkout,
    git_output,
    head_commit,
    is_git_checkout,
)
from torchkiln.source.submodules import FIX as SUBMODULE_FIX
from torchkiln.source.submodules import missing_submodules

from . import portable
from .context import Context, Ran, failure_message
from .display import Display
from .envstore import EnvStore, Restored, interpreter_identity, tree_bytes, venv_distributions
from .fingerprint import (
    Snapshot,
    digest,
    file_sha256,
    snapshot_identity,
    tree_identity,
    tree_sha256,
    tree_snapshot,
)
from .memory import Resume
from .postcheck import INSTALLED
from .progress import CompileProgress, PhaseTracker
from .publish import publish
from .pythons import bring_in, torch_in_place
from .reconfigure import reconfigure
from .sandbox import isolated, probing
from .sandbox import record as isolation_record
from .toolchain_records import remembered_toolchain
from .treeguard import (
    Observed,
    OutputRecords,
    check_source,
    compile_steps,
    foreign,
    observe,
    own_paths,
    owned_in,
    skipped,
    written,
)
from .treelabel import check_label
from .vision_watch import VisionWatcher
from .watch import Contradiction, Expectations, SummaryWatcher, Watcher

ZIP_EPOCH_MIN = 315532800  # 1980-01-01: a zip file cannot carry an earlier time


# --------------------------------------------------------------------------------------------------
# The kinds.
# --------------------------------------------------------------------------------------------------


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


class FetchKind(StepKind):
    name = "fetch"
    forced = False

    def inputs(self, step: Step, ctx: Context) -> dict[str, str]:
        # One identity for all fetch steps of a checkout: a changed URL, ref or pin fetches it from scratch
        # (git remote add would fail on the old checkout); a resumed fetch continues.
        source = ctx.plan.source(step.project)
        group = [s.argv for s in ctx.plan.steps if s.kind == "fetch" and s.project == step.project]
        return {"commit": source.commit or "", "fetch": digest(group)}

    def intact(self, step: Step, entry: Mapping[str, Any], ctx: Context) -> bool:
        """A checkout's fetch steps are one chain: a step counts as done only while the checkout is still
        what the chain left (:func:`~torchkiln.source.git.checkout_intact`: a removed ``.git``, an emptied
        directory, a file in its place, a HEAD or object store that is gone), no earlier step of the chain
        ran again in this build, and no earlier step's record is missing while a later one's is there.
        Otherwise the chain starts over from its first step, which empties the directory."""
        chain = [s for s in ctx.plan.steps if s.kind == "fetch" and s.project == step.project]
        ran = {r.name for r in ctx.records if r.status == "ran"}
        if any(s.name in ran for s in chain):
            return False
        recorded = [ctx.state.get(s.name) is not None for s in chain]
        if False in recorded and any(recorded[recorded.index(False) :]):
            return False
        pinned = next((ctx.state.get(s.name) for s in chain if s.pins), None)
        head = (pinned or {}).get("outputs", {}).get("head")
        return checkout_intact(ctx.plan.source(step.project).path, head)

    def execute(self, step: Step, ctx: Context) -> Ran:
        """As every kind, and a failed fetch also names the ways out (issue 11)."""
        try:
            return super().execute(step, ctx)
        except BuildFailed as exc:
            ways = (
                f"\nways out: a mirror you can reach as the recipe's {step.project}.repo (a URL or a local "
                f"clone's path), or an existing checkout with --source-dir {step.project}=PATH"
            )
            raise BuildFailed(f"{exc}{ways}", step=exc.step, log=exc.log) from None

    def outputs(self, step: Step, ran: Ran, ctx: Context) -> dict[str, Any]:
        return {"head": head_commit(ctx.plan.source(step.project).path)} if step.pins else {}

    def verify(self, step: Step, entry: Mapping[str, Any], ctx: Context) -> None:
        """The checkout the chain left (also when skipped): at the recipe's pin, with its submodules (a
        repository whose ``.gitmodules`` lists one that ``submodule update`` does not check out, e.g. with
        ``update = none``, would otherwise fail in the compile, after the env steps)."""
        if step.pins:
            source = ctx.plan.source(step.project)
            check_pin(ctx.plan.recipe.spec(step.project), source.path)
            missing = missing_submodules(source.path)
            if missing is not None:
                raise BuildFailed(
                    f"{step.name}: the fetched checkout lacks its submodules: {missing.found()}; "
                    f"`{SUBMODULE_FIX}` did not check them out (nothing was built)\nways out: a repository "
                    f"(the recipe's {step.project}.repo) whose submodules all check out, or a complete "
                    f"checkout with --source-dir {step.project}=PATH",
                    step=step.name,
                )
            # the commit's tree and the build's own outputs only (torchkiln.build.treeguard)
            differences = check_source(ctx.plan, source, force=ctx.options.force)
            if differences and not ctx.options.allow_dirty:
                spec = ctx.plan.recipe.spec(step.project)
                raise BuildFailed(
                    dirty_checkout(spec, source.path, differences, "nothing was built"), step=step.name
                )
            # the version the wheel is labelled with is the tree's own (torchkiln.build.treelabel)
            for compile_step in compile_steps(ctx.plan, step.project):
                check_label(compile_step, source.path)


class EnvKind(StepKind):
    name = "env"
    forced = False


class CompileKind(StepKind):
    """A wheel build in a source tree. Before it runs, the tree's version must be the wheel's label
    (torchkiln.build.treelabel) and a fetched checkout its commit's tree plus the build's own outputs
    (torchkiln.build.treeguard); what it writes into the tree (its in-tree outputs: build/, torchvision's
    version.py, found by comparing the tree before and after it) is recorded as its own, and left out of the
    identity of a tree that is not a git checkout, so a rerun with nothing changed is a no-op; the tree's
    ``scratch`` directories (its in-tree build/) are kept for incremental builds and removed by ``--force``."""

    name = "compile"

    def __init__(self) -> None:
        self._recorded: dict[str, list[str]] = {}  # step -> in-tree outputs the project's compiles recorded
        self._before: dict[str, Snapshot] = {}  # step -> its tree (without git) before this run
        self._prepared: dict[str, set[str]] = {}  # step -> what its own prepare wrote into that tree
        self._compilers: dict[str, dict[str, str]] = {}  # step -> compiler versions of its last run
        self._tree: dict[str, tuple[Observed, set[str]]] = {}  # step -> its tree before it ran, own paths
        self._after: dict[str, Observed] = {}  # step -> its tree after it ran

    def inputs(self, step: Step, ctx: Context) -> dict[str, str]:
        source = _source_of(step, ctx)
        if source is None:
            return {}
        entry = ctx.state.get(step.name) or {}
        self._recorded[step.name] = sorted(owned_in(ctx.plan, step.project))
        self._compilers[step.name] = _compilers(entry.get("outputs", {}).get("toolchain"))
        return {"tree": tree_identity(source.path, self._recorded[step.name], skipped(ctx.plan))}

    def prepare(self, step: Step, ctx: Context) -> None:
        source = _source_of(step, ctx)
        if source is not None:
            check_label(step, source.path)
            self._guard(step, ctx, source)
        plain = source is not None and not is_git_checkout(source.path)
        pre = tree_snapshot(source.path, skipped(ctx.plan)) if source is not None and plain else None
        try:
            self._prepare(step, ctx, source, pre)
        except BaseException:
            self._record_tree(step, ctx)  # what it moved or wrote into the tree (a parked build/) is its own
            raise

    def _prepare(self, step: Step, ctx: Context, source: Source | None, pre: Snapshot | None) -> None:
        super().prepare(step, ctx)
        for moved in bring_in(step):  # a build for several Pythons: this Python's build/ into the tree
            ctx.display.note(f"{step.name}: {moved}")
        linked = torch_in_place(step)  # torchvision: the build venv's torch where cpp_extension looks
        if linked is not None:
            ctx.display.note(f"{step.name}: {linked}")
        session = ctx.open_cache(step)
        for directory in map(Path, step.scratch):
            if ctx.options.force and directory.is_dir() and not directory.is_symlink():
                shutil.rmtree(directory)
            elif os.path.lexists(directory) and not directory.is_dir():  # a file where the directory belongs
                directory.unlink()
                ctx.display.note(f"removed {directory}: a file where the compile's build directory belongs")
            # a changed configuration must reach CMake (torchkiln.build.reconfigure)
            done = reconfigure(directory, {**step.env, **session.public_env})
            if done is not None:
                ctx.display.note(f"{step.name}: {done}")
        if source is not None and pre is not None:
            after = self._before[step.name] = tree_snapshot(source.path, skipped(ctx.plan))
            # what the step's own preparation wrote (build/torchkiln-configure.json, a parked build/):
            # the build's, never the source's newest file
            self._prepared[step.name] = {n for n, st in after.items() if pre.get(n) != st}

    def _guard(self, step: Step, ctx: Context, source: Source) -> None:
        """The tree before the compile: a fetched checkout that differs from its commit by more than the
        build's own outputs is refused (``--force`` exempts the scratch directories it is about to remove;
        ``--allow-dirty`` lets it through, recorded by publish); what is the build's own is noted, to tell
        what this run writes."""
        observed = observe(source.path, skipped(ctx.plan))
        owned = owned_in(ctx.plan, step.project)
        if observed.git and not source.provided and not ctx.options.allow_dirty:
            exempt = [
                Path(d).relative_to(source.path)
                for d in step.scratch
                if ctx.options.force and Path(d).is_relative_to(source.path)
            ]
            differences = foreign(observed, owned, exempt)
            if differences:
                raise BuildFailed(
                    dirty_checkout(
                        ctx.plan.recipe.spec(step.project), source.path, differences, "nothing was compiled"
                    ),
                    step=step.name,
                )
        self._tree[step.name] = (observed, own_paths(observed, owned))

    def _record_tree(self, step: Step, ctx: Context) -> None:
        """After the compile (also one that failed or was stopped, whose partial outputs are in the tree):
        what it created or changed in the tree, recorded as its own (torchkiln.build.treeguard.OutputRecords)."""
        source, before = _source_of(step, ctx), self._tree.pop(step.name, None)
        if source is None or before is None:
            return
        after = observe(source.path, skipped(ctx.plan))
        OutputRecords(ctx.plan.paths.workdir).save(step.name, written(before[0], after, before[1]))
        self._after[step.name] = after

    def layers(self, step: Step, ctx: Context) -> tuple[Mapping[str, str], ...]:
        session = ctx.open_cache(step)
        # the cache's server holds its credentials (and the cluster's token): the compiles get none of them
        return (step.env, self._reproducible(step, ctx), session.public_env, ctx.dist_env, session.secret_env)

    def _reproducible(self, step: Step, ctx: Context) -> dict[str, str]:
        """``SOURCE_DATE_EPOCH`` from the source (its commit's time, else its newest file but the build's own
        outputs): the wheel's zip timestamps, so a rebuild of unchanged sources is bit-identical. A plan that
        sets it (`torchkiln reproduce`: the recorded epoch, torchkiln.plan.rebuild) is followed."""
        if "SOURCE_DATE_EPOCH" in step.env:
            return {"SOURCE_DATE_EPOCH": step.env["SOURCE_DATE_EPOCH"]}
        source = _source_of(step, ctx)
        if source is None:
            return {}
        before = self._before.get(step.name)
        if before is None:
            epoch = int(git_output(source.path, "log", "-1", "--format=%ct").strip() or 0)
        else:
            recorded = set(self._recorded.get(step.name, ())) | self._prepared.get(step.name, set())
            epoch = max((m // 10**9 for n, (_, m) in before.items() if n not in recorded), default=0)
        return {"SOURCE_DATE_EPOCH": str(max(epoch, ZIP_EPOCH_MIN))}

    def observer(self, step: Step, ctx: Context) -> LineObserver:
        ctx.display.live_bar(step)
        # torch's CMake summary and torchvision's setup.py lines: each watcher is inert on the other's output
        watchers = (
            SummaryWatcher(Expectations.for_step(step.env, ctx.plan.recipe)),
            VisionWatcher.for_step(step.env),
        )
        return CompileObserver(ctx.display, watchers)

    def execute(self, step: Step, ctx: Context) -> Ran:
        """As every kind; a run whose compiles died for memory resumes with fewer jobs, the killed units
        first, each alone (torchkiln.build.memory), until it succeeds or the retries are spent. However it
        ends, what it wrote into the tree is recorded as the build's own."""
        if not ctx.options.skip_checks:
            ctx.warming.start(ctx.plan.steps)  # the check venv cloned meanwhile (build.warmcheck)
        try:
            resume = Resume.start(step, ctx, lambda layer: self.environment(step, ctx, layer))
            while True:
                before = resume.counter()
                done, observer = self.stream(step, ctx, resume.layer())
                failed = done.returncode not in (0, None) and not (observer and observer.verdict())
                death = resume.death(done, before) if failed else None
                if death is None:
                    ran = self.result(step, done, observer)
                    return replace(
                        ran, seconds=ran.seconds + resume.spent, memory_retries=list(resume.retries)
                    )
                resume.recover(done, death)
        finally:
            self._record_tree(step, ctx)

    def outputs(self, step: Step, ran: Ran, ctx: Context) -> dict[str, Any]:
        out = super().outputs(step, ran, ctx)
        session = ctx.open_cache(step)
        env = compose(ctx.environ, step.env, session.public_env, path_prepend=step.path_prepend)
        with probing(step, ctx, env):  # the venv's python, cmake, ninja: in the step's sandbox (when probed)
            toolchain = remembered_toolchain(
                env,
                Path(step.argv[0]),  # the build venv's python: the step's own Python's
                Records.for_build(ctx.plan.paths.workdir, ctx.plan.env_store),
                workdir=ctx.plan.paths.workdir,
                cuda=ctx.plan.recipe.accelerator.is_cuda,
                cache_tool=session.config.kind if session.config.enabled else None,
            )
        out["toolchain"] = jsonfile.to_data(toolchain)
        ctx.cache_causes += _miss_causes(step, ctx, self._compilers.get(step.name, {}), out["toolchain"])
        # what it ran with: the cache's effective variables, and the wheel's SOURCE_DATE_EPOCH
        out["env"] = {**step.env, **self._reproducible(step, ctx), **session.public_env}
        source, after = _source_of(step, ctx), self._after.pop(step.name, None)
        if source is not None and after is not None and not after.git:
            own = own_paths(after, owned_in(ctx.plan, step.project))
            # no commit names this tree: its contents do (without what the build wrote into it, which the
            # manifest lists for `torchkiln reproduce`: torchkiln.artifacts.manifest.Rebuild.tree_outputs)
            out["tree_outputs"] = sorted(own)
            out["tree_sha256"] = tree_sha256(source.path, own, skipped(ctx.plan))
        return out

    def settled_inputs(self, step: Step, ctx: Context, outputs: Mapping[str, Any]) -> dict[str, str] | None:
        before = self._before.pop(step.name, None)
        self._prepared.pop(step.name, None)
        if before is None:
            return None
        return {"tree": snapshot_identity(before, sorted(owned_in(ctx.plan, step.project)))}


class PackageKind(StepKind):
    """Rewrites wheels another step made (torchvision's bundling): its input is their content (``reads``),
    its output a wheel directory of its own, which then holds the project's final wheels."""

    name = "package"


class ChecksKind(StepKind):
    name = "checks"
    optional = True

    def prepare(self, step: Step, ctx: Context) -> None:
        ctx.warming.join(step.venv)  # its venv's warm clone, when one was started, is whole or gone
        super().prepare(step, ctx)

    def observer(self, step: Step, ctx: Context) -> LineObserver | None:
        if not step.facts:
            return None
        # Once pip has installed the wheels, while the check imports them (which changes no file of the
        # venv): the store's entry for the venv is staged and the wheels' portability read (issue 38).
        jobs = {
            "staged": lambda: self.stage(step, ctx),
            "portability": lambda: portable.analyse_checked(step, ctx),
        }
        return InstalledObserver(jobs)

    def execute(self, step: Step, ctx: Context) -> Ran:
        """As every kind; what the observer worked out meanwhile goes to :meth:`outputs` and :meth:`keep`."""
        done, observer = self.stream(step, ctx)
        early = observer if isinstance(observer, InstalledObserver) else None
        try:
            ran = self.result(step, done, observer)
            found = early.results() if early is not None else {}
        except BaseException:
            if early is not None:
                EnvStore.discard(early.wait().get("staged"))
            raise
        staged = found.pop("staged", None)
        if staged is not None:
            ctx.staged[step.name] = staged
        return replace(ran, early={k: v for k, v in found.items() if v is not None})

    def outputs(self, step: Step, ran: Ran, ctx: Context) -> dict[str, Any]:
        out = super().outputs(step, ran, ctx)
        if step.facts:
            out["facts"] = _last_json(ran.tail)
            # the installed wheels, where they are (read while the check ran, or now)
            early = ran.early.get("portability")
            out["portability"] = early if early is not None else portable.analyse_checked(step, ctx)
        return out

    def verify(self, step: Step, entry: Mapping[str, Any], ctx: Context) -> None:
        if step.facts:
            # Also when skipped: the wheels are unchanged, the recipe may not be.
            checks = _compare_with_recipe(ctx, step, entry.get("outputs", {}).get("facts"), entry.get("log"))
            if step.python:  # a later Python of several (python.versions): recorded beside the first's
                ctx.python_checks[step.python] = checks
            else:
                ctx.checks = checks
            portable.judge(ctx, step, entry.get("outputs", {}), entry.get("log"))


class PublishKind(StepKind):
    name = "publish"
    always_runs = True

    def execute(self, step: Step, ctx: Context) -> Ran:
        """The end of a build that succeeded (torchkiln.build.publish): wheels, lock file, manifest."""
        changed = publish(ctx)
        return Ran(0.0, None, status="ran" if changed else "skipped")


KINDS: dict[str, StepKind] = {
    kind.name: kind
    for kind in (FetchKind(), EnvKind(), CompileKind(), PackageKind(), ChecksKind(), PublishKind())
}


# --------------------------------------------------------------------------------------------------
# Reading a compile step's output.
# --------------------------------------------------------------------------------------------------


class LineObserver:
    """Reads a step's output line by line (runner.stream); True from ``__call__`` stops the step."""

    stopped = "stopped"  # how a stop on :meth:`verdict` is described

    def __call__(self, line: str) -> bool:
        return False

    def verdict(self) -> list[Contradiction] | None:
        """Contradictions that stopped (or, at the end of the output, would stop) the step."""
        return None

    def phases(self) -> dict[str, float] | None:
        return None


class InstalledObserver(LineObserver):
    """The post-build check's output: at its line saying pip has installed the wheels
    (:data:`~torchkiln.build.postcheck.INSTALLED`), ``jobs`` run in a thread, in order, beside the check's
    import of them (issue 38): each reads the installed files, which the import does not change."""

    def __init__(self, jobs: Mapping[str, Callable[[], Any]]) -> None:
        self.jobs = dict(jobs)
        self.thread: threading.Thread | None = None
        self.found: dict[str, Any] = {}
        self.error: BaseException | None = None

    def __call__(self, line: str) -> bool:
        if self.thread is None and line.rstrip("\n") == INSTALLED:
            self.thread = threading.Thread(target=self._run, name="after-install", daemon=True)
            self.thread.start()
        return False

    def _run(self) -> None:
        for name, job in self.jobs.items():
            try:
                self.found[name] = job()
            except BaseException as exc:  # noqa: BLE001 - raised again in the builder's thread (results)
                self.error = exc
                return

    def wait(self) -> dict[str, Any]:
        """What the jobs returned, once they are done (none: the line never came)."""
        if self.thread is not None:
            self.thread.join()
        return self.found

    def results(self) -> dict[str, Any]:
        """:meth:`wait`, a job's exception raised here (what was staged before it discarded)."""
        found = self.wait()
        if self.error is not None:
            EnvStore.discard(found.get("staged"))
            raise self.error
        return found


class CompileObserver(LineObserver):
    """ninja's progress to the display, the wheel step's phases, and the watchers of its configuration."""

    def __init__(self, display: Display, watchers: Sequence[Watcher]) -> None:
        self.display = display
        self.watchers = tuple(watchers)
        self.progress = CompileProgress()
        self.tracker = PhaseTracker()
        self.mismatch: list[Contradiction] | None = None

    def __call__(self, line: str) -> bool:
        entered = self.tracker.feed(line)
        if entered is not None:
            self.display.phase(entered)
        p = self.progress.feed(line)
        if p is not None:
            self.display.compile_progress(p)
        for watcher in self.watchers:
            verdict = watcher.feed(line)
            if verdict:
                self.mismatch, self.stopped = verdict, watcher.what
                return True
        return False

    def verdict(self) -> list[Contradiction] | None:
        for watcher in self.watchers:
            if self.mismatch is not None:
                break
            verdict = watcher.close()
            if verdict:
                self.mismatch, self.stopped = verdict, watcher.what
        return self.mismatch

    def phases(self) -> dict[str, float] | None:
        return self.tracker.finish()


# --------------------------------------------------------------------------------------------------
# Helpers of the kinds.
# --------------------------------------------------------------------------------------------------


COMPILERS = ("gcc", "g++", "clang", "clang++", "nvcc")


def _compilers(toolchain: Any) -> dict[str, str]:
    """Compiler -> version of a recorded toolchain (its ``tools`` table)."""
    tools = toolchain.get("tools", {}) if isinstance(toolchain, dict) else {}
    return {n: str(t.get("version")) for n, t in tools.items() if n in COMPILERS and isinstance(t, dict)}


def _miss_causes(step: Step, ctx: Context, before: Mapping[str, str], toolchain: Any) -> list[str]:
    """What this compile makes likely to miss in the cache: a tree or the build venv outside the cache's
    basedir (its absolute path is hashed: builders at other paths miss), a compiler changed since the last
    build of the step (objects made by the old one do not match)."""
    causes = []
    basedir = ctx.plan.cache.basedir
    source = _source_of(step, ctx)
    if basedir is not None and ctx.plan.cache.enabled:
        for what, path in (
            ("source tree", source.path if source else None),
            ("build venv", ctx.plan.paths.venv),
        ):
            if path is not None and not path.is_relative_to(basedir):
                causes.append(
                    f"paths differ between builders: the {what} {path} is outside the cache's basedir "
                    f"{basedir}, so its absolute path is hashed"
                )
    now = _compilers(toolchain)
    for name, version in sorted(before.items()):
        if now.get(name) not in (None, version):
            causes.append(f"compiler changed: {name} {version} built this step last time, now {now[name]}")
    return causes


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


def _source_of(step: Step, ctx: Context) -> Source | None:
    return next((s for s in ctx.plan.sources if s.name == step.project), None)


def _writes_to(step: Step) -> str | None:
    """Where a step writes (what a full disk there would stop): its fresh directory, wheels, venv, output."""
    return step.fresh or step.wheels or step.venv or step.creates or step.cwd


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
    # the verification support only where a check's facts are compared (not in a --skip-checks build)
    from torchkiln.verify.buildconfig import postbuild_checks  # noqa: PLC0415
    from torchkiln.verify.facts import BuildFacts  # noqa: PLC0415

    facts = BuildFacts.from_dict(facts_doc)
    # The commit each project was built from (its checkout's HEAD), for a recipe that pins none.
    commits = {s.name: head_commit(s.path) for s in ctx.plan.sources if is_git_checkout(s.path)}
    # the wheels of the step's Python, in a build for several (python.versions)
    recipe = replace(ctx.plan.recipe, python=step.python, pythons=()) if step.python else ctx.plan.recipe
    results = postbuild_checks(recipe, facts, ctx.plan.projects, commits=commits)
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
