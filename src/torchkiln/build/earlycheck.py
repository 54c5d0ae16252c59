"""The post-build check's interpreter started while the compile runs (issue 47).

The first check in a fresh work directory waited on torch's import: the check's interpreter imported torch
and the modules the checked wheels reach (:data:`torchkiln.build.postcheck.WARM_UP`) only once the wheels were
built, about 1.7 s on two cores, half the check. The check venv is already cloned while the compile runs
(:mod:`torchkiln.build.warmcheck`); this module goes on from there, in the clone's thread:

1. :meth:`EarlyStart.prune` prunes the clone as ``checks:venv`` will (:mod:`torchkiln.build.venvprune`), with
   the requirements of the wheels still being built predicted (:data:`PREDICTED`), in ``checks:venv``'s
   sandbox. What it removed is written in the clone's mark. ``checks:venv`` prunes the clone it takes again
   with the built wheels' own requirements, and clones afresh when the prediction removed one of them
   (``venvprune --removed-before``).
2. The warm clone is put at the check venv's own path (the interpreter's paths are the check's), and
   :meth:`EarlyStart.serve` starts ``checks:import``'s command with ``--serve`` there, in that step's
   sandbox and environment: :func:`torchkiln.build.postcheck.serve` lists the venv's distributions, imports
   torch in an interpreter of its own and waits. Before ``checks:venv`` the clone goes back beside the check
   venv (:meth:`torchkiln.build.warmcheck.Warming.join`), so that step takes it as any warm clone.
3. ``checks:import`` takes that interpreter when its venv, after the prune and pip, holds the same
   distributions (each RECORD's identity) as when the listing was taken, plus only distributions whose names
   torch's import did not look for: :func:`torchkiln.build.postcheck.early_words`, the rule the check
   already had for the interpreter it starts itself. Otherwise a fresh interpreter gives the facts.

Without a prediction for every checked project the clone is left as before and nothing is started. The
server is a process of this run (:func:`torchkiln.process.runner.spawn`): stopped when the build ends,
however it ends, and SIGKILLed by the run's watchdog if torchkiln dies.

All of this runs beside the compile, which is the build's critical path, so all of it starts in scheduling
groups at the lowest priority (:data:`LOWEST`): the clone's ``cp`` (:meth:`EarlyStart.link`), the prune, pip
and the server. Each is a session of its own, and where the kernel schedules sessions as groups of equal
weight (autogroups, on in Debian's kernels) a process's niceness orders it only within its own group, so it
is the session's group that is lowered (:func:`torchkiln.process.runner.spawn`'s ``nice``). Measured on the
real torchvision 0.21.0 tree: the compile of the first checked build waited 1.8-2.0 s for a CPU (PSI)
against 0.3 s in a warm build with no early work, and lowering the groups took 0.1-0.3 s off that build in
each of 8 quiet rounds (docs/performance.md).

The invariant: **the build never waits on work it lowered.** On a machine whose cores other work keeps busy
a lowered group gets next to nothing, and once the compile is done the build waits for this work
(:meth:`torchkiln.build.warmcheck.Warming.join`). So the wait begins with :meth:`EarlyStart.hurry`: every
lowered group still running is raised back to torchkiln's own level (:func:`torchkiln.process.runner.restore`,
which needs no privilege), and what starts after that starts there. Only groups are lowered, never the
processes: a process's niceness cannot be raised again without privilege. Where sessions are not scheduling
groups (a kernel without autogroups, a CPU cgroup below the root) nothing is lowered.
"""

from __future__ import annotations

import contextlib
import email.parser
import itertools
import shutil
import subprocess
import threading
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from torchkiln.process import runner

from .envstore import clone_tree, link_argv, venv_distributions
from .postcheck import PIP_QUIET
from .sandbox import isolated, probing

if TYPE_CHECKING:
    from torchkiln.plan.model import Step

    from .context import BuildRecord, BuildSetup
    from .stepkind import StepKind

PRUNE = Path(__file__).resolve().parent / "venvprune.py"  # run by the clone's python, as checks:venv runs it

# What each checked project's wheel requires at run time besides torch (its METADATA's Requires-Dist), known
# before the wheel is built: torchvision's setup.py, ``get_requirements()`` in the 0.21.0 release tree:
# numpy, torch, and pillow (pillow-simd where that is installed: then the check clones afresh). A wrong entry costs the
# early start, never the check: ``checks:venv`` prunes with the built wheel's own.
PREDICTED: Mapping[str, tuple[str, ...]] = {"torchvision": ("numpy", "pillow")}

Stop = Callable[[], None]

LOWEST = 19  # the niceness of the scheduling groups of what runs beside the compile (see the docstring)


@dataclass(frozen=True)
class EarlyStart:
    """What a build's warm clone needs to start the check (see the module's docstring)."""

    setup: BuildSetup
    record: BuildRecord
    kinds: Mapping[str, StepKind]
    # the processes at work for the warm clone (a stopping build kills them rather than wait: halt)
    live: list[subprocess.Popen[str]] = field(default_factory=list)
    halted: threading.Event = field(default_factory=threading.Event)
    # the processes started in lowered groups, and whether the build waits for them now (hurry)
    lowered: list[subprocess.Popen[str]] = field(default_factory=list)
    hurried: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _environment(self, step: Step) -> dict[str, str]:
        return self.kinds[step.kind].start(step, self.setup, self.record).environment()

    def _run(self, step: Step, argv: list[str], what: str) -> None:
        """``argv`` run to its end as ``step``'s probe (its sandbox and environment); OSError naming ``what``
        when it fails or the build is stopping."""
        env = self._environment(step)
        with probing(step, self.setup, self.record, env):
            if self.halted.is_set():
                raise OSError(f"{what}: the build is stopping")
            self._finish(self._spawn(argv, env=env), what)

    def _spawn(self, argv: Sequence[str], **options: Any) -> subprocess.Popen[str]:
        """``argv`` started by :func:`torchkiln.process.runner.spawn` in a group at :data:`LOWEST`, or at
        torchkiln's own level once the build waits (:meth:`hurry`): never lowered after that."""
        with self.lock:
            if self.hurried.is_set():
                return runner.spawn(argv, **options)
            proc = runner.spawn(argv, nice=LOWEST, **options)
            self.lowered.append(proc)
        return proc

    def hurry(self) -> None:
        """The build waits for this work now: each lowered group still running raised back to torchkiln's
        level, and nothing started lowered after this."""
        with self.lock:
            self.hurried.set()
            waiting = [proc for proc in self.lowered if proc.poll() is None]
            self.lowered.clear()
        for proc in waiting:
            runner.restore(proc.pid)

    def _finish(self, proc: subprocess.Popen[str], what: str) -> None:
        """``proc`` waited for, killed by :meth:`halt` meanwhile; OSError naming ``what`` when it failed."""
        self.live.append(proc)
        try:
            done = runner.finish(proc)
        finally:
            self.live.remove(proc)
        if not done.ok:
            raise OSError(f"{what} failed: {done.failure()}")

    def link(self, source: Path, target: Path) -> None:
        """``target`` a tree of hard links to ``source``'s files, as :func:`clone_tree` makes it, by a ``cp``
        at the lowest priority that :meth:`halt` kills; where links fail (another filesystem),
        :func:`clone_tree`'s copy. OSError when it fails or the build is stopping (nothing left)."""
        if self.halted.is_set():
            raise OSError("the warm clone: the build is stopping")
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._finish(self._spawn(link_argv(source, target)), "the warm clone's cp")
        except (OSError, runner.ProcessError):
            shutil.rmtree(target, ignore_errors=True)
            if self.halted.is_set():
                raise OSError("the warm clone: the build is stopping") from None
            clone_tree(source, target)

    def prune(self, step: Step, warm: Path) -> tuple[str, ...] | None:
        """``warm`` (``step``'s, ``checks:venv``'s, clone) pruned with the checked projects' predicted
        requirements; the names it removed, or None (nothing done) without a prediction for each project.
        OSError when the prune fails (the clone is then of no use)."""
        keep, drop = _values(step.argv, "--keep"), _values(step.argv, "--drop")
        if not drop or any(name not in PREDICTED for name in drop):
            return None
        keep += itertools.chain.from_iterable(PREDICTED[name] for name in drop)
        before = installed(warm)
        argv = [str(warm / "bin" / "python"), str(PRUNE), *(f"--keep={n}" for n in keep)]
        self._run(step, [*argv, *(f"--drop={name}" for name in drop)], "the warm check venv's prune")
        return tuple(sorted(before - installed(warm)))

    def complete(self, check: Step, venv: Path) -> None:
        """What the checked projects are predicted to require and ``venv`` (the warm clone, at the check
        venv's path) lacks, installed as the check's pip would install it (its constraints, index and
        sandbox): pillow for torchvision, from the index, off the check's critical path. OSError when pip
        fails."""
        projects = [a.partition("==")[0] for a in _values(check.argv, "--expect")]
        have = installed(venv)
        missing = [n for p in projects for n in PREDICTED.get(p, ()) if canonicalize_name(n) not in have]
        if not missing:
            return
        constraints = _values(check.argv, "--constraints")
        pinned = [a for c in constraints if Path(c).is_file() for a in ("--constraint", c)]
        argv = [str(venv / "bin" / "python"), "-m", "pip", "install", *PIP_QUIET, *pinned, "--", *missing]
        self._run(check, argv, "the warm check venv's pip install")

    def serve(self, step: Step) -> Stop | None:
        """``step`` (``checks:import``)'s command started with ``--serve`` in its sandbox; what stops it, or
        None when it cannot start."""
        if self.halted.is_set():
            return None
        stack = contextlib.ExitStack()
        try:
            environment = self._environment(step)
            argv, env = stack.enter_context(
                isolated(step, self.setup, self.record, [*step.argv, "--serve"], environment, "/")
            )
            proc = self._spawn(argv, env=env, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except (OSError, runner.ProcessError):
            stack.close()
            return None

        def stop() -> None:
            runner.end_group(proc.pid, pid=proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
            stack.close()

        return stop

    def halt(self) -> None:
        """The build is stopping: what is at work for the warm clone killed, nothing more started."""
        self.halted.set()
        for proc in list(self.live):
            runner.end_group(proc.pid, pid=proc.pid)

    def foreseen(self, step: Step) -> bool:
        return foreseen(step)


def foreseen(step: Step) -> bool:
    """Whether the wheels ``step`` (``checks:venv``) prunes for (its ``--requirements-of`` wheelhouses)
    require only what :meth:`EarlyStart.prune` kept: ``--keep`` and the prediction for each ``--drop``
    project. Their METADATA's Requires-Dist read as venvprune reads it (markers evaluated, here, with no
    extra); a wheel that cannot be read is not foreseen. Where this says no, the warm clone is made again
    unpruned (:meth:`torchkiln.build.warmcheck.Warming.settle`); where the check venv's interpreter
    evaluates a marker otherwise, venvprune's ``--removed-before`` still says so."""
    kept = {canonicalize_name(n) for n in _values(step.argv, "--keep")}
    kept |= {canonicalize_name(n) for p in _values(step.argv, "--drop") for n in PREDICTED.get(p, ())}
    for directory in _values(step.argv, "--requirements-of"):
        for wheel in sorted(Path(directory).glob("*.whl")):
            lines = _requirement_lines(wheel)
            if lines is None:
                return False
            for line in lines:
                try:
                    req = Requirement(line)
                except InvalidRequirement:  # venvprune leaves it out too
                    continue
                applies = req.marker is None or req.marker.evaluate({"extra": ""})
                if applies and canonicalize_name(req.name) not in kept:
                    return False
    return True


def _requirement_lines(wheel: Path) -> list[str] | None:
    """The Requires-Dist lines of ``wheel``'s METADATA; None when it cannot be read."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
            if not names:
                return None
            text = archive.read(names[0]).decode("utf-8", "replace")
    except Exception:  # noqa: BLE001 - a damaged wheel: the check's pip says what is wrong with it
        return None
    return email.parser.Parser().parsestr(text, headersonly=True).get_all("Requires-Dist", [])


def _values(argv: Sequence[str], option: str) -> list[str]:
    """Each value of ``option`` in ``argv`` (``--option VALUE`` or ``--option=VALUE``)."""
    found = [a.partition("=")[2] for a in argv if a.startswith(option + "=")]
    return found + [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == option]


def installed(venv: Path) -> set[str]:
    """The distributions in ``venv``'s site-packages, by canonical name (their ``.dist-info`` directories)."""
    found = venv_distributions(venv)
    return {canonicalize_name(name.partition("-")[0]) for name in found if name.endswith(".dist-info")}
