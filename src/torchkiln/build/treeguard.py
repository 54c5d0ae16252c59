"""The tree a build compiles is its commit's tree plus the build's own outputs, and nothing else.

Invariant: what a wheel is built from a fetched ref is exactly that commit's tree
(:func:`torchkiln.source.exact.git_differences`: no extra, modified or removed path, submodules included) plus
the files the build itself wrote into it (its in-tree outputs: ``build/``, ``*.egg-info``, a generated
``version.py``, torch's copied libraries). The build declares those as it makes them: after each compile step
(also one that failed or was interrupted), every untracked path the step created or changed in the tree is
recorded with its :data:`~torchkiln.source.exact.Stat` in ``<workdir>/tree-outputs/<step>.json``, and so is
what a later ``package`` or ``checks`` step wrote (``<project>:<step>.json``: a post-build hook's file in
``build/``). A path the commit tracks is never an output, whatever a step did to it (and in a tree without git,
nor is a path that was there before the step, unless under ``build/`` or an ``*.egg-info``): a step that
changes one fails the build (:mod:`torchkiln.build.treewatch`). A path is the build's own only while it still
has exactly the stat recorded there: a file planted at an output path before the build, or replaced after
it, is not (its ctime differs, which no unprivileged writer can set back).

The tree is checked three times (:func:`check`): after the fetch steps (before anything reads it), right
before each compile (after the fetch steps and the env steps; ``--force`` exempts the compile's scratch
directories, which it removes), and by the publish step (so nothing slipped in between). A fetched checkout
with any other difference is refused naming every path; with ``--allow-dirty`` it is built, and each path is
recorded with its kind and the sha256 of what was built (:func:`torchkiln.source.exact.changes`: the manifest, the lock file and the
provenance). A ``--source-dir`` git checkout is the user's: recorded the same way, never refused. A tree that
is no git checkout has no commit to differ from: its record is the digest of every entry but the build's
own outputs (:func:`own_paths`, :func:`torchkiln.files.digests.tree_sha256`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from torchkiln.artifacts.lockfile import TreeLink
from torchkiln.errors import BuildFailed, few
from torchkiln.files import atomic
from torchkiln.plan.model import Plan, Source, Step
from torchkiln.source.exact import (
    Difference,
    Stat,
    git_differences,
    outside_links,
    stats,
    tracked_links,
    tree_paths,
)
from torchkiln.source.git import is_git_checkout

RECORDS = "tree-outputs"  # under the work directory: one file per step that records its outputs


@dataclass(frozen=True)
class Observed:
    """A tree as the build found it: for a git checkout, every path that differs from its commit (with its
    difference); for a tree without git, every entry. Each with its stat, to tell the build's own."""

    git: bool
    stats: dict[str, Stat]
    differences: dict[str, Difference] = field(default_factory=dict)


def skipped(plan: Plan) -> tuple[Path, ...]:
    """The build's own directories, never part of a tree even when they lie inside it (a build run from the
    source tree with the default ``.torchkiln`` and ``dist``; torchvision's ``build/torch-site``, the link to the
    build venv's torch that its compile imports, whichever work directory made it last)."""
    sites = sorted({Path(step.torch_site) for step in plan.steps if step.torch_site})
    return (plan.paths.workdir, plan.paths.dist, *sites)


def observe(tree: Path, skip: Collection[Path] = ()) -> Observed:
    if is_git_checkout(tree):
        found = git_differences(tree, skip=skip)
        return Observed(True, stats(tree, [d.path for d in found]), {d.path: d for d in found})
    return Observed(False, stats(tree, tree_paths(tree, skip=skip)))


class OutputRecords:
    """``<workdir>/tree-outputs/<record>.json``: per compile step (its name) and per package or checks step and
    tree (``<project>:<step>``), the untracked paths it wrote into the tree with their stat."""

    def __init__(self, workdir: Path) -> None:
        self.root = workdir / RECORDS

    def _path(self, step: str) -> Path:
        return self.root / f"{step}.json"

    def load(self, step: str) -> dict[str, Stat]:
        """What ``step`` recorded; nothing when its record is missing or damaged (then nothing is its own)."""
        try:
            data = json.loads(self._path(step).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        out: dict[str, Stat] = {}
        for name, value in data.items():
            if value is None:
                out[name] = None
            elif isinstance(value, list) and len(value) == 5 and all(isinstance(v, int) for v in value):
                out[name] = (value[0], value[1], value[2], value[3], value[4])
        return out

    def save(self, step: str, written: Mapping[str, Stat]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        data = {name: None if st is None else list(st) for name, st in sorted(written.items())}
        atomic.write_text(self._path(step), json.dumps(data, separators=(",", ":")))

    def owned(self, project: str, steps: Iterable[Step] = ()) -> dict[str, set[Stat]]:
        """Every stat a compile step of ``project`` recorded for each path: the plan's own ``steps``
        and those of earlier plans in this work directory (another Python, since dropped from the recipe),
        whose outputs are still in the tree. A later step may have rewritten a path an earlier one wrote:
        either record makes it the build's own."""
        out: dict[str, set[Stat]] = {}
        names = {step.name for step in steps}
        if self.root.is_dir():
            names |= {p.stem for p in self.root.glob("*.json") if p.stem.split(":", 1)[0] == project}
        for name in sorted(names):
            for path, st in self.load(name).items():
                out.setdefault(path, set()).add(st)
        return out


def compile_steps(plan: Plan, project: str) -> list[Step]:
    return [s for s in plan.steps if s.kind == "compile" and s.project == project]


def owned_in(plan: Plan, project: str) -> dict[str, set[Stat]]:
    """What the compiles of ``project`` recorded writing into its tree, in ``plan``'s work directory."""
    return OutputRecords(plan.paths.workdir).owned(project, compile_steps(plan, project))


def own_paths(observed: Observed, owned: Mapping[str, set[Stat]]) -> set[str]:
    """The observed paths that are the build's own: their stat now is one a step recorded, and (in a git
    checkout) the commit does not track them: a path of the commit is never an output, whatever a record
    made before issue 45 says."""
    return {
        name
        for name, st in observed.stats.items()
        if st in owned.get(name, ()) and not _tracked_difference(observed, name)
    }


def _tracked_difference(observed: Observed, name: str) -> bool:
    """Whether ``name`` is a path of the commit that differs (modified, removed): not an output."""
    difference = observed.differences.get(name)
    return difference is not None and difference.kind != "extra"


def declared(plan: Plan, project: str) -> Callable[[str], bool]:
    """The test whether a name (relative to ``project``'s tree) lies where upstream's build writes its outputs: the
    compile steps' in-tree scratch directories (``build/``) or an ``*.egg-info`` directory. In a tree without
    git, what is there is the tree's unless it lies there or a step recorded it."""
    scratch = [str(d) for d in scratch_of(plan, plan.source(project))]

    def lies_there(name: str) -> bool:
        if any(part.endswith(".egg-info") for part in name.split("/")[:-1]):
            return True
        return any(name == d or name.startswith(d + "/") for d in scratch)

    return lies_there


def written(
    before: Observed, after: Observed, own_before: Collection[str], is_declared: Callable[[str], bool]
) -> dict[str, Stat]:
    """What a step leaves as its own: every untracked path it created or changed (its stat differs from
    before it ran, or it was not there), and what was the build's own before and is still there untouched.
    Never a path the commit tracks (a git checkout's modified or removed paths), nor, in a tree without git,
    one that was there before the step and was not the build's own, unless it lies under a declared output
    directory (``is_declared``): those are the tree's, and a step that changes them fails the build
    (torchkiln.build.treewatch)."""
    out = {}
    for name, st in after.stats.items():
        if name in own_before:
            out[name] = st
        elif after.git and _tracked_difference(after, name):
            continue
        elif name not in before.stats or (before.stats[name] != st and (after.git or is_declared(name))):
            out[name] = st
    return out


def begin_outputs(plan: Plan, source: Source) -> tuple[Observed, set[str]]:
    """A tree before a step that records its outputs: what is there, and what of it is the build's own."""
    observed = observe(source.path, skipped(plan))
    return observed, own_paths(observed, owned_in(plan, source.name))


def record_outputs(plan: Plan, source: Source, record: str, before: tuple[Observed, set[str]]) -> Observed:
    """After such a step (also one that failed or was stopped, whose partial outputs are in the tree):
    what it created or changed in ``source``'s tree, recorded as the build's own under the name ``record``
    (:class:`OutputRecords`). Returns the tree as it found it."""
    after = observe(source.path, skipped(plan))
    found = written(before[0], after, before[1], declared(plan, source.name))
    OutputRecords(plan.paths.workdir).save(record, found)
    return after


def foreign(
    observed: Observed, owned: Mapping[str, set[Stat]], exempt: Collection[Path] = ()
) -> list[Difference]:
    """The differences of a git checkout that are not the build's own (nor under an ``exempt`` directory,
    relative to the tree: the scratch directories ``--force`` removes)."""
    own = own_paths(observed, owned)
    prefixes = [p.as_posix().rstrip("/") for p in exempt]
    return [
        d
        for name, d in sorted(observed.differences.items())
        if name not in own and not any(name == p or name.startswith(p + "/") for p in prefixes)
    ]


def scratch_of(plan: Plan, source: Source) -> list[Path]:
    """The scratch directories of ``source``'s compile steps inside its tree, relative to it: what
    ``--force`` removes before the compile, so nothing there is built from."""
    return [
        Path(d).relative_to(source.path)
        for step in compile_steps(plan, source.name)
        for d in step.scratch
        if Path(d).is_relative_to(source.path)
    ]


def check_source(plan: Plan, source: Source, *, force: bool = False) -> list[Difference]:
    """The differences of ``source``'s tree from its commit that are not the build's own ([] for a tree
    without git: it has no commit); with ``force``, none under the scratch directories it removes."""
    observed = observe(source.path, skipped(plan))
    if not observed.git:
        return []
    exempt = scratch_of(plan, source) if force else []
    return foreign(observed, owned_in(plan, source.name), exempt)


def leaving(plan: Plan, source: Source, observed: Observed | None = None) -> list[TreeLink]:
    """The symbolic links of ``source``'s tree that lead out of it (:func:`torchkiln.source.exact.leaves`),
    the build's own left out: for a git checkout the links its index holds (the commit's, which ``git
    status`` never lists) and those among its differences; for a tree without git every link."""
    if observed is None:
        observed = observe(source.path, skipped(plan))
    own = own_paths(observed, owned_in(plan, source.name))
    paths = set(observed.stats) - own
    if observed.git:
        paths |= set(tracked_links(source.path)) - own
    return outside_links(source.path, paths)


def refuse_leaving(source: Source, links: list[TreeLink], outcome: str, step: str) -> None:
    """BuildFailed naming each link that leads out of ``source``'s tree and where it points, and the ways
    out (``--allow-dirty`` builds and records them)."""
    if not links:
        return
    shown = few([f"{link.path} -> {link.link}" for link in links])
    raise BuildFailed(
        f"{source.name}: {len(links)} symbolic link(s) of the tree {source.path} lead out of it: {shown}; "
        f"what a build reads through them is in no record of the tree; {outcome}\nways out: replace each "
        "with what it points to, or point it inside the tree, or --allow-dirty to build and publish it (a "
        "warning; the manifest, the lock file and the provenance record each such link with its text)",
        step=step,
    )


def check_given_trees(plan: Plan, allow_dirty: bool) -> None:
    """Before the first step: a ``--source-dir`` tree with links that lead out of it is refused, unless
    ``allow_dirty`` (a fetched tree is checked by publish, once it is the build's)."""
    if allow_dirty:
        return
    for source in plan.sources:
        steps = compile_steps(plan, source.name)
        if source.provided and source.path.is_dir() and steps:
            refuse_leaving(source, leaving(plan, source), "nothing was built", steps[0].name)
