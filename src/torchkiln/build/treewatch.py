"""No build step changes what a source tree tracks, nor git's own data about it.

Invariant: a path the commit of a tree tracks (in the tree or in any of its submodules) is never changed,
replaced or removed by a build step (``env``, ``compile``, ``package``, ``checks``: the steps that run the
tree's code, its build dependencies' and the compilers they name), and neither is a file of the checkout's git
directories that decides what git says about it (:func:`torchkiln.source.tracked.control`: config, HEAD,
refs, hooks, info/, modules/...). In a tree without git, the same holds of every path that was there before
the step and is not the build's own (a step's recorded output, :mod:`.treeguard`, or under a declared output
directory: the compile's in-tree ``build/``, an ``*.egg-info``). A step may only create untracked paths: its
outputs. The tree is checked after every build step that runs (also one that failed) and between steps
(before the next build step and before publish: torchkiln's probes of the build venv's tools and the check
venv's warm clone run build code between them); a change fails the build right there, naming each path and
the step, so nothing is published and no record says the tree was its commit's.

Cheap enough for every step of a torch build: each tracked path is keyed on its stat identity (mode, device,
inode, size, mtime, ctime: no unprivileged writer can set a ctime back) and only a path whose identity changed
is read again and compared by its blob id (a ``touch``, or the same bytes written again, is no change). A path
whose ctime lies within :data:`RACY_NS` of when its content was last established is read every time (git's
"racily clean" rule: a write in the same clock tick leaves the same identity). A run's first baseline takes
the commit's blob ids from git (``ls-tree``; the paths ``git status`` reports changed are read as they are), so
a clean tree is never hashed whole; a tree without git is, once per run that runs a step.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from torchkiln.errors import BuildFailed, Interrupted, few
from torchkiln.plan.model import Plan, Source, Step
from torchkiln.source.tracked import Blob, blob, control, git_dirs, tracked

from .sandbox import is_build_step
from .treeguard import (
    Observed,
    begin_outputs,
    declared,
    observe,
    own_paths,
    owned_in,
    record_outputs,
    skipped,
)

RACY_NS = 2 * 10**9
# The kinds whose untracked writes into a tree are the build's own outputs, as a compile's are: the steps
# after the compile (a post-build hook writing into build/). An env step's are not: before a compile, the
# tree must be its commit's (treeguard refuses anything else).
RECORDING_KINDS = frozenset({"package", "checks"})

Key = (
    tuple[int, int, int, int, int, int] | None
)  # (mode, device, inode, size, mtime_ns, ctime_ns); None: absent


def stat_key(path: Path) -> Key:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_mode, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass
class Known:
    """A tracked path as last established: its stat identity, what it held then (None: absent) and when
    (``time.time_ns``) that was established."""

    key: Key
    blob: Blob | None
    since: int

    def racy(self) -> bool:
        return self.key is not None and self.key[5] + RACY_NS >= self.since


@dataclass(frozen=True)
class Change:
    """A tracked path (or a file of git's own) a step changed: ``path`` from the top of the tree, ``kind``
    (modified, removed, added) and ``detail`` (content, mode 100644 -> 100755, type file -> symlink, git's own
    data), written as :func:`torchkiln.source.exact.describe` writes a difference."""

    path: str
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} {self.path} ({self.detail})"


@dataclass
class Baseline:
    """One tree as the build last checked it: its tracked paths, its git directories and their files."""

    source: Source
    git: bool
    paths: dict[str, Known]
    dirs: list[Path] = field(default_factory=list)
    control: dict[str, str] = field(default_factory=dict)


def baseline(plan: Plan, source: Source) -> Baseline:
    """``source``'s tree before the first step that runs in this build: a checkout's tracked paths (the
    commit's blob ids, or what a path git reports changed holds now), or, for a tree without git, every
    path that is not the build's own, read."""
    top, now = source.path, time.time_ns()
    observed = observe(top, skipped(plan))
    if not observed.git:
        own, output = own_paths(observed, owned_in(plan, source.name)), declared(plan, source.name)
        paths = {
            name: Known(stat_key(top / name), blob(top / name), now)
            for name in observed.stats
            if name not in own and not output(name)
        }
        return Baseline(source, False, paths)
    entries, repos = tracked(top)
    changed = {d.path for d in observed.differences.values() if d.kind != "extra"}
    excluded = observed_skips(plan, source)
    paths = {}
    for name, committed in entries.items():
        if any(name == p or name.startswith(p + "/") for p in excluded):
            continue
        key = stat_key(top / name)
        held = blob(top / name) if name in changed or key is None else committed
        paths[name] = Known(key, held, now)
    dirs = git_dirs(top, repos)
    return Baseline(source, True, paths, dirs, control(top, dirs))


def observed_skips(plan: Plan, source: Source) -> list[str]:
    """The build's own directories inside ``source``'s tree (a work directory or dist/ there), relative."""
    top = source.path.resolve()
    return [p.resolve().relative_to(top).as_posix() for p in skipped(plan) if p.resolve().is_relative_to(top)]


def changes(tree: Baseline) -> list[Change]:
    """What changed in ``tree`` since it was last established (which it then is again for what is
    unchanged: a path touched but holding the same bytes takes its new identity)."""
    top, found = tree.source.path, []
    for name, known in tree.paths.items():
        key = stat_key(top / name)
        if key == known.key and not known.racy():
            continue
        now = time.time_ns()
        held = blob(top / name) if key is not None else None
        if held != known.blob:
            found.append(_change(name, known.blob, held))
        else:
            known.key, known.since = key, now
    if tree.git:
        now_control = control(top, tree.dirs)
        for name in sorted(set(now_control) | set(tree.control)):
            was, now_held = tree.control.get(name), now_control.get(name)
            if was != now_held:
                kind = "added" if was is None else "removed" if now_held is None else "modified"
                found.append(Change(name, kind, "git's own data"))
    return sorted(found, key=lambda c: c.path)


TYPES = {"120000": "symlink", "tree": "directory", "special": "special file"}


def _change(name: str, was: Blob | None, now: Blob | None) -> Change:
    if now is None:
        return Change(name, "removed", "deleted")
    if was is None:
        return Change(name, "added", "where the tree had none")
    if was[0] == now[0]:
        return Change(name, "modified", "content")
    types = [TYPES.get(mode, "file") for mode in (was[0], now[0])]
    if types[0] == types[1]:
        return Change(name, "modified", f"mode {was[0]} -> {now[0]}")
    return Change(name, "modified", f"type {types[0]} -> {types[1]}")


class TreeWatch:
    """The build's watch over its trees: :meth:`before` and :meth:`after` each step the loop runs. Made per
    build (:class:`~torchkiln.build.context.BuildSetup`): what it established is this build's."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self._trees: dict[str, Baseline] = {}
        self._last: str | None = None  # the step checked last
        self._outputs: dict[str, tuple[Observed, set[str]]] = {}  # a recording step's trees before it ran

    def before(self, step: Step) -> None:
        """Before ``step`` runs: nothing changed since the last check (raises BuildFailed naming what did);
        a build step establishes each tree not yet established (after its fetch)."""
        if self._trees:
            self._raise_changes(f"between {self._last} and {step.name}" if self._last else step.name, None)
        if step.kind == "fetch":  # git rewrites the checkout: established again after it
            self._trees.pop(step.project, None)
            return
        if not is_build_step(step):
            return
        for source in self.plan.sources:
            if source.name not in self._trees and source.path.is_dir():
                self._trees[source.name] = baseline(self.plan, source)
        if step.kind in RECORDING_KINDS:
            self._outputs = {
                s.name: begin_outputs(self.plan, s) for s in self.plan.sources if s.name in self._trees
            }

    def after(self, step: Step, failure: BaseException | None = None, log: Path | None = None) -> None:
        """After ``step`` ran (``failure``: how it failed): a recording step's outputs are recorded, and a
        changed tracked path fails the build naming it and the step (the step's own failure said too).
        Nothing is checked after an interrupt: the next build checks the tree before it runs anything."""
        if not is_build_step(step) or isinstance(failure, (KeyboardInterrupt, Interrupted)):
            return
        outputs, self._outputs = self._outputs, {}
        for name, before in outputs.items():
            record_outputs(self.plan, self.plan.source(name), f"{name}:{step.name}", before)
        self._last = step.name
        self._raise_changes(step.name, failure, failure.log if isinstance(failure, BuildFailed) else log)

    def _raise_changes(self, when: str, failure: BaseException | None, log: Path | None = None) -> None:
        for tree in self._trees.values():
            found = changes(tree)
            if found:
                raise BuildFailed(_message(tree, found, when, failure, log), step=when, log=log)


def _message(
    tree: Baseline, found: list[Change], when: str, failure: BaseException | None, log: Path | None
) -> str:
    source = tree.source
    what = (
        "its commit tracks (or git's own data about it)"
        if tree.git
        else "were there before and are not the build's outputs"
    )
    text = (
        f"{when}: {len(found)} path(s) of the {source.name} tree {source.path} that {what} changed: "
        f"{few([str(c) for c in found])}; a build step may only create untracked paths (its outputs), never "
        "change the tree it builds; nothing was published (dist/ is unchanged)"
    )
    if failure is not None:
        said = str(failure).splitlines()
        text += f"\nthe step also failed: {said[0] if said else type(failure).__name__}"
    if tree.git:
        restore = (
            f"make it its commit's tree again (git -C {source.path} checkout -- . ; for git's own data: a "
            "fetched checkout is fetched again once you remove it, a --source-dir one is yours to restore)"
        )
    else:
        restore = "restore those files from where the tree came from"
    where = f"the step's log ({log})" if log is not None else "the log of the steps"
    return (
        f"{text}\nways out: find what wrote them in {where}: the tree's setup.py or CMake, a build "
        f"dependency, a compiler the tree names, a .pth file of the venv; {restore}"
    )
