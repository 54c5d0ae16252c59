"""The kinds of the steps after the compiles, which take the built wheels further: ``package`` (rewrites
them), ``checks`` (installs them in a clean venv and compares what they say with the recipe) and ``publish``
(copies them into dist/ with the lock file and the manifest).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from torchkiln.artifacts.manifest import CheckResult, Checks
from torchkiln.errors import BuildFailed
from torchkiln.plan.model import Step
from torchkiln.source.git import head_commit, is_git_checkout

from . import portable
from .context import BuildSetup, Ran
from .envstore import EnvStore
from .observers import InstalledObserver, LineObserver
from .publish import publish
from .stepkind import StepKind, StepRun

# Rewrites wheels another step made (torchvision's bundling): its input is their content (``reads``), its
# output a wheel directory of its own, which then holds the project's final wheels.
PACKAGE = StepKind("package", StepRun)


class ChecksRun(StepRun):
    """The post-build check: the wheels installed in a clean venv, what they say compared with the recipe."""

    def observer(self) -> LineObserver | None:
        step, setup = self.step, self.setup
        if not step.facts:
            return None
        # Once pip has installed the wheels, while the check imports them (which changes no file of the
        # venv): the store's entry for the venv is staged (or, where the venv itself will be moved there,
        # its large files shared: VenvReuse.stage) and the wheels' portability read (issue 38).
        jobs = {
            "staged": self.stage,
            "portability": lambda: portable.analyse_checked(step, setup),
        }
        return InstalledObserver(jobs)

    def execute(self) -> Ran:
        """As every kind; what the observer worked out meanwhile goes to :meth:`outputs`, and what it
        staged to the loop (the environment store keeps it)."""
        done, observer = self.stream()
        early = observer if isinstance(observer, InstalledObserver) else None
        try:
            ran = self.result(done, observer)
            found = early.results() if early is not None else {}
        except BaseException:
            if early is not None:
                EnvStore.discard(early.wait().get("staged"))
            raise
        staged = found.pop("staged", None)
        return replace(ran, early={k: v for k, v in found.items() if v is not None}, staged=staged)

    def outputs(self, ran: Ran) -> dict[str, Any]:
        step = self.step
        out = super().outputs(ran)
        if step.facts:
            out["facts"] = _last_json(ran.tail)
            # the installed wheels, where they are (read while the check ran, or now)
            early = ran.early.get("portability")
            out["portability"] = early if early is not None else portable.analyse_checked(step, self.setup)
        return out

    def verify(self, entry: Mapping[str, Any]) -> None:
        step = self.step
        if step.facts:
            # Also when skipped: the wheels are unchanged, the recipe may not be.
            outputs, log = entry.get("outputs", {}), entry.get("log")
            checks = _compare_with_recipe(self.setup, step, outputs.get("facts"), log)
            # a later Python of several (python.versions) is recorded beside the first's
            self.record.add_checks(step.python, checks)
            portable.judge(self.setup, self.record, step, outputs, log)


CHECKS = StepKind("checks", ChecksRun, optional=True)


class PublishRun(StepRun):
    def execute(self) -> Ran:
        """The end of a build that succeeded (torchkiln.build.publish): wheels, lock file, manifest."""
        changed, published = publish(self.setup, self.record)
        return Ran(0.0, None, status="ran" if changed else "skipped", published=published)


PUBLISH = StepKind("publish", PublishRun, always_runs=True)


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
    setup: BuildSetup, step: Step, facts_doc: dict[str, Any] | None, log: str | None
) -> Checks:
    """The post-build check's verdict: the built wheels' facts against the recipe, with the comparison the
    verification suite uses, and each torch/torchvision commit against the checkout it was built from. Any
    mismatch stops the build before anything is published."""
    if facts_doc is None:
        raise BuildFailed(f"{step.name} printed no build facts (full log: {log})", step=step.name)
    # the verification support only where a check's facts are compared (not in a --skip-postcheck build)
    from torchkiln.verify.buildconfig import postbuild_checks  # noqa: PLC0415
    from torchkiln.verify.facts import BuildFacts  # noqa: PLC0415

    facts = BuildFacts.from_dict(facts_doc)
    # The commit each project was built from (its checkout's HEAD), for a recipe that pins none.
    plan = setup.plan
    commits = {s.name: head_commit(s.path) for s in plan.sources if is_git_checkout(s.path)}
    # the wheels of the step's Python, in a build for several (python.versions)
    recipe = replace(plan.recipe, python=step.python, pythons=()) if step.python else plan.recipe
    results = postbuild_checks(recipe, facts, plan.projects, commits=commits)
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
