"""The ``fetch`` kind: the steps that make a source checkout, one chain per checkout.

Which steps of the chain still count as done (the checkout intact), and, after the step that leaves the
checkout at its ref, the recipe's pin, the submodules, the tree against its commit
(:mod:`torchkiln.build.treeguard`) and the tree's version against the wheel's label
(:mod:`torchkiln.build.treelabel`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchkiln.errors import BuildFailed, few
from torchkiln.source.git import (
    check_pin,
    checkout_intact,
    dirty_checkout,
    head_commit,
)
from torchkiln.source.submodules import FIX as SUBMODULE_FIX
from torchkiln.source.submodules import missing_submodules
from torchkiln.source.tracked import control, git_dirs, lasting

from .context import Ran
from .fingerprint import digest
from .stepkind import StepKind, StepRun
from .treeguard import check_source, compile_steps
from .treelabel import check_label


class FetchRun(StepRun):
    """A step of a checkout's fetch chain."""

    def inputs(self) -> dict[str, str]:
        # One identity for all fetch steps of a checkout: a changed URL, ref or pin fetches it from scratch
        # (git remote add would fail on the old checkout); a resumed fetch continues.
        plan, step = self.setup.plan, self.step
        source = plan.source(step.project)
        group = [s.argv for s in plan.steps if s.kind == "fetch" and s.project == step.project]
        return {"commit": source.commit or "", "fetch": digest(group)}

    def intact(self, entry: Mapping[str, Any]) -> bool:
        """A checkout's fetch steps are one chain: a step counts as done only while the checkout is still
        what the chain left (:func:`~torchkiln.source.git.checkout_intact`: a removed ``.git``, an emptied
        directory, a file in its place, a HEAD or object store that is gone), no earlier step of the chain
        ran again in this build, and no earlier step's record is missing while a later one's is there.
        Otherwise the chain starts over from its first step, which empties the directory."""
        plan, state, step = self.setup.plan, self.setup.state, self.step
        chain = [s for s in plan.steps if s.kind == "fetch" and s.project == step.project]
        ran = {r.name for r in self.record.steps if r.status == "ran"}
        if any(s.name in ran for s in chain):
            return False
        recorded = [state.get(s.name) is not None for s in chain]
        if False in recorded and any(recorded[recorded.index(False) :]):
            return False
        pinned = next((state.get(s.name) for s in chain if s.pins), None)
        head = (pinned or {}).get("outputs", {}).get("head")
        return checkout_intact(plan.source(step.project).path, head)

    def execute(self) -> Ran:
        """As every kind, and a failed fetch also names the ways out (issue 11)."""
        try:
            return super().execute()
        except BuildFailed as exc:
            project = self.step.project
            ways = (
                f"\nways out: a mirror you can reach as the recipe's {project}.repo (a URL or a local "
                f"clone's path), or an existing checkout with --source-dir {project}=PATH"
            )
            raise BuildFailed(f"{exc}{ways}", step=exc.step, log=exc.log) from None

    def outputs(self, ran: Ran) -> dict[str, Any]:
        step = self.step
        if not step.pins:
            return {}
        path = self.setup.plan.source(step.project).path
        return {"head": head_commit(path), "git": _git_data(path)}

    def verify(self, entry: Mapping[str, Any]) -> None:
        """The checkout the chain left (also when skipped): at the recipe's pin, with its submodules (a
        repository whose ``.gitmodules`` lists one that ``submodule update`` does not check out, e.g. with
        ``update = none``, would otherwise fail in the compile, after the env steps), its commit's tree and
        git's own data about it as the fetch left them."""
        step, plan, options = self.step, self.setup.plan, self.setup.options
        if step.pins:
            source = plan.source(step.project)
            check_pin(plan.recipe.spec(step.project), source.path)
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
            differences = check_source(plan, source, force=options.force)
            if differences and not options.allow_dirty:
                spec = plan.recipe.spec(step.project)
                raise BuildFailed(
                    dirty_checkout(spec, source.path, differences, "nothing was built"), step=step.name
                )
            self._check_git_data(entry)
            # the version the wheel is labelled with is the tree's own (torchkiln.build.treelabel)
            for compile_step in compile_steps(plan, step.project):
                check_label(compile_step, source.path)

    def _check_git_data(self, entry: Mapping[str, Any]) -> None:
        """git's own data about the checkout as its fetch left it (its config, HEAD, refs, hooks, info/, its
        submodules' under modules/): changed since (by a build step of an earlier build, which failed for it,
        torchkiln.build.treewatch; or by hand), git could report the tree other than it is. Refused naming
        each file, unless --allow-dirty (a warning)."""
        step, plan = self.step, self.setup.plan
        recorded = entry.get("outputs", {}).get("git")
        if not isinstance(recorded, dict):  # recorded before issue 45: nothing to compare with
            return
        path = plan.source(step.project).path
        now = _git_data(path)
        changed = sorted(k for k in set(now) | set(recorded) if now.get(k) != recorded.get(k))
        if not changed:
            return
        what = f"git's own data about the fetched checkout {path} changed since its fetch: {few(changed)}"
        if self.setup.options.allow_dirty:
            self.record.warn(f"--allow-dirty: {what}")
            return
        raise BuildFailed(
            f"{step.name}: {what}; git could report the tree other than it is; nothing was built\nways out: "
            f"fetch it again (remove {path}: the next build fetches it), or --allow-dirty to build it as it is "
            "(a warning)",
            step=step.name,
        )


FETCH = StepKind("fetch", FetchRun, forced=False)


def _git_data(path: Path) -> dict[str, str]:
    """The files of the checkout's git data that decide what git says about it, by what they hold
    (torchkiln.source.tracked.control, without the object store's stat identities)."""
    return lasting(control(path, git_dirs(path)))
