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

from .context import Context, Ran
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
from .stepkind import StepKind
from .toolchain_records import remembered_toolchain
from .treeguard import (
    Observed,
    OutputRecords,
    foreign,
    observe,
    own_paths,
    owned_in,
    skipped,
    written,
)
from .treelabel import check_label
from .vision_watch import VisionWatcher
from .watch import Expectations, SummaryWatcher

ZIP_EPOCH_MIN = 315532800  # 1980-01-01: a zip file cannot carry an earlier time


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


def _source_of(step: Step, ctx: Context) -> Source | None:
    return next((s for s in ctx.plan.sources if s.name == step.project), None)
