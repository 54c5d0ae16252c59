"""The ``compile`` kind: a wheel build in a source tree, and what makes its compiles likely to miss the cache.

Around its command it guards, snapshots and records the source tree (:mod:`torchkiln.build.treeguard`),
sets the wheel's ``SOURCE_DATE_EPOCH``, opens the compiler cache session, watches the configuration as the
build prints it (:class:`~torchkiln.build.observers.CompileObserver`), resumes compiles killed for memory
(:mod:`torchkiln.build.memory`) and records the toolchain it used.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from torchkiln.artifacts import jsonfile
from torchkiln.errors import BuildFailed
from torchkiln.plan.model import Source, Step
from torchkiln.plan.records import Records
from torchkiln.process.environ import compose
from torchkiln.source.git import dirty_checkout, git_output, is_git_checkout

from .context import BuildRecord, BuildSetup, Ran
from .fingerprint import (
    Snapshot,
    snapshot_identity,
    tree_identity,
    tree_sha256,
    tree_snapshot,
)
from .memory import Resume
from .observers import CompileObserver, LineObserver
from .pythons import bring_in, torch_in_place
from .reconfigure import reconfigure
from .sandbox import probing
from .sboms import prefetch_writer
from .stepkind import Stage, StepKind, StepRun
from .toolchain_records import remembered_toolchain
from .treeguard import (
    Observed,
    declared,
    foreign,
    observe,
    own_paths,
    owned_in,
    record_outputs,
    skipped,
)
from .treelabel import check_label
from .vision_watch import VisionWatcher
from .watch import Expectations, SummaryWatcher

ZIP_EPOCH_MIN = 315532800  # 1980-01-01: a zip file cannot carry an earlier time


class CompileRun(StepRun):
    """A wheel build in a source tree. Before it runs, the tree's version must be the wheel's label
    (torchkiln.build.treelabel) and a fetched checkout its commit's tree plus the build's own outputs
    (torchkiln.build.treeguard); what it writes into the tree (its in-tree outputs: build/, torchvision's
    version.py, found by comparing the tree before and after it) is recorded as its own, and left out of the
    identity of a tree that is not a git checkout, so a rerun with nothing changed is a no-op; the tree's
    ``scratch`` directories (its in-tree build/) are kept for incremental builds and removed by ``--force``.

    What it learns of its tree while it runs is its own (this step, this build): the in-tree outputs the
    project's compiles recorded, the compilers of its last run, the tree before and after it."""

    def __init__(
        self, step: Step, setup: BuildSetup, record: BuildRecord, stage: Stage | None = None
    ) -> None:
        super().__init__(step, setup, record, stage)
        self.source = next((s for s in setup.plan.sources if s.name == step.project), None)
        self._recorded: list[str] = []  # in-tree outputs the project's compiles recorded
        self._compilers: dict[str, str] = {}  # compiler versions of its last run
        self._before: Snapshot | None = None  # its tree (without git) before this run
        self._prepared: set[str] = set()  # what its own prepare wrote into that tree
        self._tree: tuple[Observed, set[str]] | None = None  # its tree before it ran, and its own paths
        self._after: Observed | None = None  # its tree after it ran

    def inputs(self) -> dict[str, str]:
        if self.source is None:
            return {}
        plan = self.setup.plan
        entry = self.setup.state.get(self.step.name) or {}
        self._recorded = sorted(owned_in(plan, self.step.project))
        self._compilers = _compilers(entry.get("outputs", {}).get("toolchain"))
        return {"tree": tree_identity(self.source.path, self._recorded, skipped(plan))}

    def prepare(self) -> None:
        source, plan = self.source, self.setup.plan
        if source is not None:
            check_label(self.step, source.path)
            self._guard(source)
        plain = source is not None and not is_git_checkout(source.path)
        pre = tree_snapshot(source.path, skipped(plan)) if source is not None and plain else None
        try:
            self._prepare(pre)
        except BaseException:
            self._record_tree()  # what it moved or wrote into the tree (a parked build/) is its own
            raise

    def _prepare(self, pre: Snapshot | None) -> None:
        step, setup = self.step, self.setup
        super().prepare()
        for moved in bring_in(step):  # a build for several Pythons: this Python's build/ into the tree
            setup.display.note(f"{step.name}: {moved}")
        session = setup.cache.open(step, setup, self.record)
        for directory in map(Path, step.scratch):
            if setup.options.force and directory.is_dir() and not directory.is_symlink():
                shutil.rmtree(directory)
            elif os.path.lexists(directory) and not directory.is_dir():  # a file where the directory belongs
                directory.unlink()
                setup.display.note(f"removed {directory}: a file where the compile's build directory belongs")
            # a changed configuration must reach CMake (torchkiln.build.reconfigure)
            done = reconfigure(directory, {**step.env, **session.public_env})
            if done is not None:
                setup.display.note(f"{step.name}: {done}")
        # torchvision: the build venv's torch where cpp_extension looks, in build/ (after --force cleared it)
        linked = torch_in_place(step)
        if linked is not None:
            setup.display.note(f"{step.name}: {linked}")
        if self.source is not None and pre is not None:
            after = self._before = tree_snapshot(self.source.path, skipped(setup.plan))
            # what the step's own preparation wrote (build/torchkiln-configure.json, a parked build/):
            # the build's, never the source's newest file
            self._prepared = {n for n, st in after.items() if pre.get(n) != st}

    def _guard(self, source: Source) -> None:
        """The tree before the compile: a fetched checkout that differs from its commit by more than the
        build's own outputs is refused (``--force`` exempts the scratch directories it is about to remove;
        ``--allow-dirty`` lets it through, recorded by publish); what is the build's own is noted, to tell
        what this run writes."""
        step, setup = self.step, self.setup
        observed = observe(source.path, skipped(setup.plan))
        owned = owned_in(setup.plan, step.project)
        if observed.git and not source.provided and not setup.options.allow_dirty:
            exempt = [
                Path(d).relative_to(source.path)
                for d in step.scratch
                if setup.options.force and Path(d).is_relative_to(source.path)
            ]
            differences = foreign(observed, owned, exempt)
            if differences:
                raise BuildFailed(
                    dirty_checkout(
                        setup.plan.recipe.spec(step.project), source.path, differences, "nothing was compiled"
                    ),
                    step=step.name,
                )
        self._tree = (observed, own_paths(observed, owned))

    def _record_tree(self) -> None:
        """After the compile (also one that failed or was stopped, whose partial outputs are in the tree):
        the untracked paths it created or changed in the tree, recorded as its own
        (torchkiln.build.treeguard.record_outputs); a tracked path it changed is not (the loop's
        torchkiln.build.treewatch fails the build naming it)."""
        before, self._tree = self._tree, None
        if self.source is None or before is None:
            return
        self._after = record_outputs(self.setup.plan, self.source, self.step.name, before)

    def layers(self) -> tuple[Mapping[str, str], ...]:
        step, setup = self.step, self.setup
        session = setup.cache.open(step, setup, self.record)
        # the cache's server holds its credentials (and the cluster's token): the compiles get none of them
        cluster_env = setup.cache.cluster_env
        return (step.env, self._reproducible(), session.public_env, cluster_env, session.secret_env)

    def _reproducible(self) -> dict[str, str]:
        """``SOURCE_DATE_EPOCH`` from the source (its commit's time, else its newest file but the build's own
        outputs: what a step recorded, and whatever lies where the build writes, treeguard.declared: a file
        a cache server wrote into build/ after a stopped build recorded its outputs is no source): the
        wheel's zip timestamps, so a rebuild of unchanged sources is bit-identical. A plan that sets it
        (`torchkiln reproduce`: the recorded epoch, torchkiln.plan.rebuild) is followed."""
        step = self.step
        if "SOURCE_DATE_EPOCH" in step.env:
            return {"SOURCE_DATE_EPOCH": step.env["SOURCE_DATE_EPOCH"]}
        if self.source is None:
            return {}
        before = self._before
        if before is None:
            epoch = int(git_output(self.source.path, "log", "-1", "--format=%ct").strip() or 0)
        else:
            recorded = set(self._recorded) | self._prepared
            output = declared(self.setup.plan, step.project)
            epoch = max(
                (m // 10**9 for n, (_, m) in before.items() if n not in recorded and not output(n)),
                default=0,
            )
        return {"SOURCE_DATE_EPOCH": str(max(epoch, ZIP_EPOCH_MIN))}

    def observer(self) -> LineObserver:
        step, setup = self.step, self.setup
        setup.display.live_bar(step)
        # torch's CMake summary and torchvision's setup.py lines: each watcher is inert on the other's output
        watchers = (
            SummaryWatcher(Expectations.for_step(step.env, setup.plan.recipe)),
            VisionWatcher.for_step(step.env),
        )
        return CompileObserver(setup.display, watchers)

    def execute(self) -> Ran:
        """As every kind; a run whose compiles died for memory resumes with fewer jobs, the killed units
        first, each alone (torchkiln.build.memory), until it succeeds or the retries are spent. However it
        ends, what it wrote into the tree is recorded as the build's own."""
        prefetch_writer()
        try:
            resume = Resume.start(self.step, self.setup, self.record, self.environment)
            while True:
                before = resume.counter()
                done, observer = self.stream(resume.layer())
                failed = done.returncode not in (0, None) and not (observer and observer.verdict())
                death = resume.death(done, before) if failed else None
                if death is None:
                    ran = self.result(done, observer)
                    return replace(
                        ran, seconds=ran.seconds + resume.spent, memory_retries=list(resume.retries)
                    )
                resume.recover(done, death)
        except BaseException:
            # The compiles in flight may be the cache server's (a daemon, or its own sandbox: not in the
            # command's process group, so not ended with it), writing into the tree (a unit's depfile as it
            # preprocesses, its object) until that server stops: it stops before the tree is recorded, and
            # nothing writes there after (a stopped build's kills it and them; treewatch reads after this).
            self.setup.cache.close(self.setup, self.record)
            raise
        finally:
            self._record_tree()

    def outputs(self, ran: Ran) -> dict[str, Any]:
        step, setup = self.step, self.setup
        out = super().outputs(ran)
        session = setup.cache.open(step, setup, self.record)
        env = compose(setup.environ, step.env, session.public_env, path_prepend=step.path_prepend)
        with probing(step, setup, self.record, env):  # the venv's python, cmake, ninja: in its sandbox
            toolchain = remembered_toolchain(
                env,
                Path(step.argv[0]),  # the build venv's python: the step's own Python's
                Records.for_build(setup.plan.paths.workdir, setup.plan.env_store),
                workdir=setup.plan.paths.workdir,
                cuda=setup.plan.recipe.accelerator.is_cuda,
                cache_tool=session.config.kind if session.config.enabled else None,
            )
        out["toolchain"] = jsonfile.to_data(toolchain)
        self.record.add_cache_causes(_miss_causes(step, setup, self._compilers, out["toolchain"]))
        # what it ran with: the cache's effective variables, and the wheel's SOURCE_DATE_EPOCH
        out["env"] = {**step.env, **self._reproducible(), **session.public_env}
        after, self._after = self._after, None
        if self.source is not None and after is not None and not after.git:
            own = own_paths(after, owned_in(setup.plan, step.project))
            # no commit names this tree: its contents do (without what the build wrote into it, which the
            # manifest lists for `torchkiln reproduce`: torchkiln.artifacts.manifest.Rebuild.tree_outputs)
            out["tree_outputs"] = sorted(own)
            out["tree_sha256"] = tree_sha256(self.source.path, own, skipped(setup.plan))
        return out

    def settled_inputs(self, outputs: Mapping[str, Any]) -> dict[str, str] | None:
        before, self._before, self._prepared = self._before, None, set()
        if before is None:
            return None
        return {"tree": snapshot_identity(before, sorted(owned_in(self.setup.plan, self.step.project)))}


COMPILE = StepKind("compile", CompileRun, warms=True)


COMPILERS = ("gcc", "g++", "clang", "clang++", "nvcc")


def _compilers(toolchain: Any) -> dict[str, str]:
    """Compiler -> version of a recorded toolchain (its ``tools`` table)."""
    tools = toolchain.get("tools", {}) if isinstance(toolchain, dict) else {}
    return {n: str(t.get("version")) for n, t in tools.items() if n in COMPILERS and isinstance(t, dict)}


def _miss_causes(step: Step, setup: BuildSetup, before: Mapping[str, str], toolchain: Any) -> list[str]:
    """What this compile makes likely to miss in the cache: a tree or the build venv outside the cache's
    basedir (its absolute path is hashed: builders at other paths miss), a compiler changed since the last
    build of the step (objects made by the old one do not match)."""
    causes = []
    plan = setup.plan
    basedir = plan.cache.basedir
    source = next((s for s in plan.sources if s.name == step.project), None)
    if basedir is not None and plan.cache.enabled:
        for what, path in (
            ("source tree", source.path if source else None),
            ("build venv", plan.paths.venv),
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
