"""A compile step whose compiles died for memory resumes by itself, with fewer jobs.

``MAX_JOBS`` comes from estimates (:mod:`torchkiln.plan.jobs`), and the heaviest units beat any estimate
(flash-attention and CUTLASS kernels take 8-16 GB each under nvcc). When the kernel kills a compile, the
step's run fails; instead of stopping the build there:

1. the failure is recognised as one (:func:`Resume.death`): the compiler driver's, the shell's and ninja's
   lines in the step's log (:mod:`torchkiln.process.killed`), the rise of this process's cgroup's
   ``oom_kill`` counter over the run (:mod:`torchkiln.host.cgroup`), the step's own process dying of SIGKILL;
2. the units that died are rebuilt first, each alone: ``ninja -C DIR -j1 OBJECT`` in the in-tree build
   directory whose ``build.ninja`` knows the object (``ninja -t query``), with the step's environment. Alone,
   a unit has all the memory there is (the build script is not running either), and its peak resident
   memory is measured (:attr:`torchkiln.process.runner.Streamed.peak_rss`);
3. the step runs again with half the jobs (``MAX_JOBS``, and ``CMAKE_BUILD_PARALLEL_LEVEL`` where the plan
   sets it): ninja keeps what was built, so the step resumes where it died.

Each retry is said in the progress output and recorded with the step (the manifest's ``memory_retries``);
the log of each run that died is kept beside the step's log (``<step>.killed-N.log``). The build stops,
naming the units, what their compile reached and what to do, when a unit is killed even alone (fewer jobs
cannot help) or once the plan's ``memory_retries`` retries are spent.
"""

from __future__ import annotations

import shutil
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from torchkiln.artifacts.manifest import KilledUnit, MemoryRetry
from torchkiln.errors import BuildFailed
from torchkiln.host import cgroup
from torchkiln.plan.model import Step
from torchkiln.process import runner
from torchkiln.process.killed import KilledEdge, read_kills

from .context import BuildRecord, BuildSetup, failure_message
from .sandbox import isolated, probing

# Where an in-tree build keeps its build.ninja, under a step's scratch directory: CMake's build/ (torch),
# torch.utils.cpp_extension's build/temp.<platform>-<python>/ (torchvision), one level deeper for a
# generator that nests (scikit-build-core's build/<wheel tag>/).
NINJA_FILES = ("build.ninja", "*/build.ninja", "*/*/build.ninja")
QUERY_TIMEOUT_S = 60.0
MIB = 1024**2


@dataclass(frozen=True)
class Death:
    """What says a run died for memory: the ninja edges that did, the evidence, the cgroup counter's rise."""

    edges: tuple[KilledEdge, ...]
    evidence: list[str]
    oom_kills: int | None


@dataclass(frozen=True)
class Located:
    """Where a killed unit can be rebuilt alone: ninja, its build directory, and the unit as shown."""

    ninja: str
    directory: Path
    unit: str  # its source file, relative to the source tree when in it


@dataclass
class Resume:
    """A compile step's runs: the jobs the next one gets, and what each retry did."""

    step: Step
    setup: BuildSetup
    record: BuildRecord
    environment: Callable[[Mapping[str, str]], dict[str, str]]  # the step's environment under a layer
    jobs: int
    group: cgroup.Cgroup | None
    retries: list[MemoryRetry] = field(default_factory=list)
    spent: float = 0.0  # seconds of the runs that died and of the units rebuilt alone

    @classmethod
    def start(
        cls,
        step: Step,
        setup: BuildSetup,
        record: BuildRecord,
        environment: Callable[[Mapping[str, str]], dict[str, str]],
    ) -> Resume:
        jobs = environment({}).get("MAX_JOBS", "")
        value = int(jobs) if jobs.isdigit() else setup.plan.jobs.value
        return cls(step, setup, record, environment, value, cgroup.find("memory"))

    def layer(self) -> dict[str, str]:
        """The next run's jobs over the step's environment: the plan's until a retry halved them."""
        if not self.retries:
            return {}
        names = ["MAX_JOBS"] + [n for n in ("CMAKE_BUILD_PARALLEL_LEVEL",) if n in self.step.env]
        return dict.fromkeys(names, str(self.jobs))

    def counter(self) -> int | None:
        return self.group.oom_kills() if self.group is not None else None

    def death(self, done: runner.Streamed, before: int | None) -> Death | None:
        """Whether a failed run died for memory, and what says so; None: it failed for another reason."""
        with done.log.open(encoding="utf-8", errors="replace") as lines:
            kills = read_kills(lines)
        evidence = list(kills.evidence)
        rose = _rise(before, self.counter())
        if rose:
            evidence.append(f"the cgroup's oom_kill counter rose by {rose} ({self._group_name()})")
        if done.returncode == -signal.SIGKILL:
            evidence.append(f"{self.step.name}'s own process died of SIGKILL")
        return Death(kills.edges, evidence, rose) if evidence else None

    def recover(self, done: runner.Streamed, death: Death) -> None:
        """After a run that died for memory: the killed units rebuilt alone, the jobs halved for the next run.
        Raises BuildFailed when the retries are spent or a unit died alone."""
        attempt = len(self.retries) + 1
        self.spent += done.seconds
        log = _set_aside(done.log, f"killed-{attempt}")
        env = self.environment(self.layer())
        with probing(
            self.step, self.setup, self.record, env
        ):  # the build venv's ninja: in the step's sandbox
            located = [(edge, _locate(edge.target, self.step, env)) for edge in death.edges]
        if attempt > self.setup.plan.memory_retries:
            raise self._give_up(death, [_unit(e, found, self.step) for e, found in located], log, spent=True)
        before, self.jobs = self.jobs, max(1, self.jobs // 2)
        self.setup.display.resume(self._announce(death, located, attempt, before), self._label(attempt))
        units = [self._alone(edge, found, attempt, i) for i, (edge, found) in enumerate(located, 1)]
        self.retries.append(
            MemoryRetry(attempt, before, self.jobs, units, death.evidence, death.oom_kills, str(log))
        )
        if any(u.alone == "killed" for u in units):
            raise self._give_up(death, units, log, spent=False)
        self.setup.display.note(
            f"retry {attempt}/{self.setup.plan.memory_retries}: {self.step.name} resumes with "
            f"MAX_JOBS={self.jobs} (ninja keeps what was built)"
        )

    # -- the units, alone -----------------------------------------------------------------------------

    def _alone(self, edge: KilledEdge, found: Located | None, attempt: int, index: int) -> KilledUnit:
        """The unit rebuilt alone (ninja -j1) when a build directory of the step knows it: "built" or
        "killed", with its peak; a unit that fails for another reason fails the build as any compile."""
        if found is None:
            return _unit(edge, None, self.step)
        log = self.setup.step_log(self.step).with_suffix(f".retry-{attempt}.unit-{index}.log")
        argv = [found.ninja, "-C", str(found.directory), "-j1", edge.target]
        before = self.counter()
        # ninja runs the tree's compile commands: in the step's sandbox, as the step itself
        with isolated(self.step, self.setup, self.record, argv, self.environment(self.layer())) as (run, env):
            done = runner.stream(
                run, log=log, env=env, redact=self.setup.redact, header=f"# {' '.join(argv)}", measure=True
            )
        self.spent += done.seconds
        if done.returncode == 0:
            self.setup.display.note(f"{found.unit}: built alone (peak {_size(done.peak_rss)})")
            return KilledUnit(found.unit, edge.target, edge.evidence, "built", done.peak_rss)
        if self.death(done, before) is None:
            name = f"{self.step.name}: {found.unit} alone"
            failure = failure_message(name, done.returncode, done.seconds, log)
            raise BuildFailed(failure, step=self.step.name, log=log)
        self.setup.display.note(f"{found.unit}: killed again alone, after reaching {_size(done.peak_rss)}")
        return KilledUnit(found.unit, edge.target, edge.evidence, "killed", done.peak_rss)

    # -- what is shown --------------------------------------------------------------------------------

    def _announce(
        self, death: Death, located: list[tuple[KilledEdge, Located | None]], attempt: int, before: int
    ) -> list[str]:
        units = ", ".join(_unit(e, found, self.step).unit for e, found in located)
        return [
            f"{self.step.name}: compiles died for memory at MAX_JOBS={before}: {units or 'none named in the log'}",
            *(f"  {line}" for line in death.evidence),
            f"retry {attempt}/{self.setup.plan.memory_retries}: "
            + ("the killed units alone (ninja -j1), then " if located else "")
            + f"the step again with MAX_JOBS={self.jobs}",
        ]

    def _label(self, attempt: int) -> str:
        return f"retry {attempt}/{self.setup.plan.memory_retries}, MAX_JOBS={self.jobs}"

    def _group_name(self) -> str:
        group = self.group
        return f"cgroup v{group.version} {group.path}" if group is not None else "no cgroup"

    def _give_up(self, death: Death, units: list[KilledUnit], log: Path, *, spent: bool) -> BuildFailed:
        """The build stops: which units keep dying, what they reached, how much memory there was, what to do."""
        resources = self.setup.plan.resources
        if spent:
            count = len(self.retries)
            history = " -> ".join(str(j) for j in [r.jobs_before for r in self.retries] + [self.jobs])
            head = f"compiles kept dying for memory after {count} retr{'y' if count == 1 else 'ies'} (MAX_JOBS {history})"
            fewer = f"build with --jobs {self.jobs // 2}, " if self.jobs > 1 else ""
            fix = f"{fewer}give the build more memory, or allow more retries (--memory-retries, build.memory_retries)"
        else:
            head = "a unit was killed for memory even when compiled alone: fewer jobs cannot help"
            fix = (
                "give the build more memory (the container's or cgroup's memory limit, a larger machine, "
                "swap), or leave that unit out of the build"
            )
        lines = [f"{self.step.name}: {head}"]
        lines += [f"  {_describe(u)}" for u in units] or [f"  {line}" for line in death.evidence]
        peak = self.group.peak() if self.group is not None else None
        lines.append(
            f"memory for this build: {resources.memory_gib:.1f} GiB ({resources.memory_source})"
            + (f"; {self._group_name()} peaked at {_size(peak)}" if peak is not None else "")
        )
        lines += [f"what to do: {fix}", f"log of the run that died: {log}"]
        return BuildFailed("\n".join(lines), step=self.step.name, log=log)


# --------------------------------------------------------------------------------------------------
# Helpers.
# --------------------------------------------------------------------------------------------------


def _locate(target: str, step: Step, env: Mapping[str, str]) -> Located | None:
    """ninja, the build directory whose build.ninja has ``target``, and the unit's source; None when no
    build directory of the step knows it (or there is no ninja on the step's PATH)."""
    ninja = shutil.which("ninja", path=env.get("PATH"))
    if ninja is None:
        return None
    for scratch in map(Path, step.scratch):
        for directory in sorted({p.parent for pattern in NINJA_FILES for p in scratch.glob(pattern)}):
            query = runner.run(
                [ninja, "-C", str(directory), "-t", "query", target], env=env, timeout=QUERY_TIMEOUT_S
            )
            if query.ok:
                source = _first_input(query.stdout)
                return Located(ninja, directory, _shown(str(directory / source) if source else target, step))
    return None


def _first_input(query: str) -> str | None:
    """The explicit input of an edge in ``ninja -t query`` output (``  input: cxx`` then ``    a.cpp``;
    implicit ``| dep`` and order-only ``|| dep`` inputs come after it)."""
    lines = query.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("input:"):
            following = lines[i + 1].strip() if i + 1 < len(lines) else ""
            return following if following and not following.startswith("|") else None
    return None


def _shown(source: str, step: Step) -> str:
    """A unit as a user knows it: its source relative to the source tree when it is in it."""
    path, cwd = Path(source), Path(step.cwd or "/")
    return str(path.relative_to(cwd)) if path.is_absolute() and path.is_relative_to(cwd) else source


def _unit(edge: KilledEdge, found: Located | None, step: Step) -> KilledUnit:
    """A killed unit not (yet) rebuilt alone."""
    return KilledUnit(found.unit if found else _shown(edge.target, step), edge.target, edge.evidence)


def _describe(unit: KilledUnit) -> str:
    alone = {
        "built": f"built alone, peak {_size(unit.peak_rss)}",
        "killed": f"killed again when compiled alone (ninja -j1), after reaching {_size(unit.peak_rss)}",
    }.get(unit.alone or "", "not rebuilt alone")
    return f"{unit.unit}: {alone}; first: {unit.evidence}"


def _rise(before: int | None, after: int | None) -> int | None:
    return after - before if before is not None and after is not None else None


def _set_aside(log: Path, label: str) -> Path:
    """The log of a run that died, kept beside the step's (the next run writes the step's log again)."""
    kept = log.with_suffix(f".{label}.log")
    log.replace(kept)
    return kept


def _size(value: int | None) -> str:
    if value is None:
        return "unknown"
    return f"{value / MIB:.0f} MiB" if value < 10 * 1024 * MIB else f"{value / 1024 / MIB:.1f} GiB"
