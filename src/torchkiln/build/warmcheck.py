"""The post-build check's venv cloned while the compile runs (issue 38): a fresh work directory's first check.

``checks:venv`` makes the check venv a clone of the build venv (:mod:`torchkiln.build.checkvenv`). In a fresh
work directory the build venv is itself a clone of an environment store entry, made just before the compile;
cloning it again for the check (tens of thousands of hard links, a quarter of a second) waited for the
compile, whose second core is mostly idle once its objects come from the cache. So while a compile step runs,
:meth:`Warming.start` clones that same store entry, which nothing changes, into ``<check venv>.warm`` in a thread,
relocated to the check venv's path, and marks it with the build venv it stands for (:data:`MARK`).
``checks:venv`` (run with ``--warm``) takes it in place of its own clone when the mark names its ``--from``
(:func:`take`), and prunes it as before.

Only a venv that no step has changed since it was cloned from the store is warmed: a step that runs on it
(pip installing into it) drops its origin and any warm clone of it (:meth:`Warming.changed`). The compile itself installs nothing; the bytecode a
compile may write into the build venv is a cache the check writes again if it needs it. What is not taken
(a check that is skipped or reused: :meth:`Warming.drop`, beside the steps after it; a build that stops) is
removed before the build ends (:meth:`Warming.finish`).

With an :class:`Early` (:mod:`torchkiln.build.earlycheck`) the clone goes further while the compile runs: it
is pruned as predicted (the mark then lists what that removed), put at the check venv's own path while that
path is free, and the check's interpreter started in it; :meth:`Warming.join` puts it back beside the check
venv before ``checks:venv`` looks (or any step decides on that venv), and :meth:`Warming.finish` stops what
was started.

Where ``checks:venv`` would clone the build venv itself, :meth:`Warming.settle` clones it first, outside the
step's sandbox (see there): a thread's clone that failed, or one whose predicted prune the built wheels'
requirements go beyond.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from torchkiln.process.runner import in_context, stopping

from .envstore import clone_tree, relocate_venv

if TYPE_CHECKING:  # build.checkvenv imports this module after the compile: the plan's model is a third of it
    from torchkiln.plan.model import Step

MARK = ".torchkiln-warm"  # in the warm clone, written last: the build venv it is a clone of, what a prune removed


class Early(Protocol):
    """The check started in a warm clone (:class:`torchkiln.build.earlycheck.EarlyStart`)."""

    def link(self, source: Path, target: Path) -> None: ...

    def prune(self, step: Step, warm: Path) -> tuple[str, ...] | None: ...

    def complete(self, check: Step, venv: Path) -> None: ...

    def serve(self, step: Step) -> Callable[[], None] | None: ...

    def halt(self) -> None: ...

    def hurry(self) -> None: ...

    def foreseen(self, step: Step) -> bool: ...


def warm_path(check_venv: Path) -> Path:
    """Where the check venv is warmed (beside it: the same filesystem, so taking it is a rename); the plan's
    ``Paths.warm_check_venv``."""
    return check_venv.with_name(check_venv.name + ".warm")


@dataclass
class Warming:
    """The build's venvs cloned from the store in this run and unchanged since (venv -> the entry's venv and
    the path it was kept from), and the warm clones under way (check venv -> its thread and the build venv
    it clones)."""

    origins: dict[str, tuple[Path, str]] = field(default_factory=dict)
    threads: dict[str, tuple[threading.Thread, str]] = field(default_factory=dict)
    removers: list[threading.Thread] = field(default_factory=list)
    early: Early | None = None
    placed: set[str] = field(default_factory=set)  # check venvs whose warm clone is at their own path
    stops: list[Callable[[], None]] = field(default_factory=list)  # the checks started early

    def cloned(self, venv: str, entry_venv: Path, kept_from: str) -> None:
        self.origins[venv] = (entry_venv, kept_from)

    def changed(self, venv: str) -> None:
        """A step is about to change ``venv``: it has no origin any more, and a warm clone of it is dropped
        (a whole build's torch compile warms the check venv before install-torch puts that torch in)."""
        self.origins.pop(venv, None)
        for check_venv, (_, source) in list(self.threads.items()):
            if source == venv:
                self.join(check_venv)
                shutil.rmtree(warm_path(Path(check_venv)), ignore_errors=True)
                del self.threads[check_venv]

    def start(self, steps: Iterable[Step]) -> None:
        """A thread for each check venv of ``steps`` (a plan's) whose build venv has an origin and no warm
        clone yet."""
        steps = list(steps)
        for step in steps:
            origin = self.origins.get(step.clones) if step.clones and step.venv else None
            if origin is None or step.venv is None or step.venv in self.threads:
                continue
            # the check that uses this venv: started in the clone when it can be (build.earlycheck)
            check = next((s for s in steps if s.facts and s.venv == step.venv), None)
            thread = threading.Thread(
                target=in_context(self._warm),
                args=(*origin, step.clones, step, check),
                name="warm-check-venv",
                daemon=True,
            )
            self.threads[step.venv] = (thread, step.clones)
            thread.start()

    def join(self, venv: str | None) -> None:
        """The warm clone of ``venv`` finished (or failed: then nothing is marked), and beside ``venv`` again,
        before a step decides on it. The build waits for the early work from here: it is no longer lowered
        (:meth:`Early.hurry`)."""
        found = self.threads.get(venv) if venv else None
        if self.early is not None and (found is not None or venv in self.placed):
            self.early.hurry()
        if found is not None:
            found[0].join()
        if venv in self.placed:
            self.placed.discard(venv)
            with contextlib.suppress(OSError):
                Path(venv).rename(warm_path(Path(venv)))

    def _warm(
        self, entry_venv: Path, kept_from: str, build_venv: str, step: Step, check: Step | None
    ) -> None:
        """The clone of ``entry_venv`` for ``step`` (``checks:venv``), and with :attr:`early` the check
        started in it (see the module's docstring)."""
        target = Path(step.venv or "")
        warm = warm_path(target)
        early = self.early if check is not None else None
        prune = functools.partial(early.prune, step) if early is not None else None
        link = early.link if early is not None else clone_tree
        removed = _clone(entry_venv, kept_from, build_venv, target, prune, link)
        if removed is False:  # a store entry swept meanwhile, a full disk: settle clones again
            return
        if removed is None or check is None or self.early is None or os.path.lexists(target):
            return
        try:
            warm.rename(target)
            self.placed.add(str(target))
            self.early.complete(check, target)  # at its own path: what pip writes names it
        except OSError:  # a half-finished install is of no use: checks:venv clones afresh
            self.placed.discard(str(target))
            shutil.rmtree(target, ignore_errors=True)
            return
        stop = self.early.serve(check)
        if stop is not None:
            self.stops.append(stop)

    def settle(self, step: Step) -> None:
        """``step`` (``checks:venv``) is about to run, its warm clone joined: where the step would clone the
        build venv itself, the clone is made here, unpruned, outside the step's sandbox. There the environment
        store and the work directory are separate mounts: a hard link between them fails, and the step
        copied every file of the store's entry (11 to 24 s for torch's venv on two cores). That is where the
        thread's clone failed, and where its predicted prune may have removed what the built wheels need
        (their requirements beyond the prediction: :meth:`Early.foreseen`)."""
        if step.clones is None or step.venv is None or step.clones not in self.origins:
            return
        warm = warm_path(Path(step.venv))
        lines = _mark(warm)
        if lines[:1] == [step.clones] and (
            len(lines) == 1 or self.early is None or self.early.foreseen(step)
        ):
            return
        _clone(*self.origins[step.clones], step.clones, Path(step.venv))

    def drop(self, venv: str | None) -> None:
        """The warm clone of ``venv`` will not be taken (its step was skipped or reused): removed in a thread,
        beside the steps that follow."""
        self.join(venv)
        found = self.threads.pop(venv, None) if venv else None
        if found is not None:
            remover = threading.Thread(
                target=in_context(_remove), args=(found[0], venv), name="drop-warm", daemon=True
            )
            self.removers.append(remover)
            remover.start()

    def finish(self) -> None:
        """Every warm clone finished, and what no step took removed (a stopping build does not wait for what
        is at work for them: it is killed)."""
        if self.early is not None and stopping():
            self.early.halt()
        for venv in list(self.threads):
            self.drop(venv)
        for remover in self.removers:
            remover.join()
        self.removers.clear()
        while self.stops:
            self.stops.pop()()


def _remove(thread: threading.Thread, venv: str) -> None:
    thread.join()
    shutil.rmtree(warm_path(Path(venv)), ignore_errors=True)


def _clone(
    entry_venv: Path,
    kept_from: str,
    build_venv: str,
    target: Path,
    prune: Callable[[Path], tuple[str, ...] | None] | None = None,
    link: Callable[[Path, Path], None] = clone_tree,
) -> tuple[str, ...] | None | Literal[False]:
    """``entry_venv`` cloned by ``link`` beside ``target`` (:func:`warm_path`), relocated to ``target``, given to
    ``prune``, and marked as a clone of ``build_venv`` with what the prune removed (which it returns: None
    without a prune, or where it did nothing). False, and nothing left, where it failed."""
    warm = warm_path(target)
    try:
        shutil.rmtree(warm, ignore_errors=True)
        link(entry_venv, warm)
        relocate_venv(warm, kept_from, str(target))
        removed = prune(warm) if prune is not None else None
        (warm / MARK).write_text("\n".join([build_venv, *(removed or ())]), encoding="utf-8")
    except OSError:  # checks:venv clones as it always did
        shutil.rmtree(warm, ignore_errors=True)
        return False
    return removed


def _mark(warm: Path) -> list[str]:
    """The lines of ``warm``'s mark (the build venv it is a clone of, what a prune removed); none without."""
    try:
        return (warm / MARK).read_text(encoding="utf-8").split("\n")
    except OSError:
        return []


def take(warm: Path, source: Path, target: Path) -> tuple[str, ...] | None:
    """``warm`` renamed to ``target`` when it is whole and marked as a clone of ``source``: the distributions
    a predicted prune removed from it (often none); None (and ``warm`` removed) otherwise."""
    lines = _mark(warm)
    if lines[:1] == [str(source)]:
        (warm / MARK).unlink()
        with contextlib.suppress(OSError):
            warm.rename(target)
            return tuple(lines[1:])
    shutil.rmtree(warm, ignore_errors=True)
    return None
