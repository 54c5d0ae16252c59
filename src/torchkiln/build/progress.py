"""Compile progress from build output: ninja's ``[done/total]`` (and Make's ``[ NN%]``) as percent and ETA.

PyTorch builds with ninja (CMAKE_GENERATOR=Ninja) and torch.utils.cpp_extension uses ninja too, so the
compile stage of both torch and torchvision prints ``[123/4567] Building CXX object ...``. One progress per
project over all its ninja runs; the ETA is a smoothed time per edge times the edges left: what a user wants
to know three hours into a build.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

NINJA_RE = re.compile(r"^\[(?P<done>\d+)/(?P<total>\d+)\]\s")
MAKE_RE = re.compile(r"^\[\s*(?P<percent>\d{1,3})%\]\s")


@dataclass(frozen=True)
class Progress:
    """A project's compile so far, over all its ninja runs (torchvision's extensions are one run each)."""

    done: int
    total: int  # the edges of the runs seen so far (a later run's are unknown until it starts)
    elapsed: float  # seconds since the first progress line
    eta: float | None  # seconds left for the known edges, None until there is a rate to extrapolate from
    runs: int = 1

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 0.0

    @property
    def percent(self) -> float:
        return 100.0 * self.fraction

    def counts(self) -> str:
        """``27/43, ETA 1m10s``: what a bar shows beside its own percentage."""
        eta = f", ETA {format_duration(self.eta)}" if self.eta is not None else ""
        return f"{self.done}/{self.total}{eta}"

    def describe(self) -> str:
        eta = f", ETA {format_duration(self.eta)}" if self.eta is not None else ""
        return f"{self.done}/{self.total} ({self.percent:.0f}%{eta})"


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


class CompileProgress:
    """Feed it output lines; it returns a :class:`Progress` for every progress line, else None.

    A build may run several ninja invocations in a row (torch's CMake build then its extensions;
    torchvision's ``_C`` then ``image``): one progress counts them all, so it never restarts at a few percent
    (a new run's edges join the total when it starts). The ETA is the edges left times a smoothed time per
    edge (an exponential average over the intervals between progress lines, each clamped near the average,
    so a burst of cached edges or one slow file does not swing it); the gap between two runs (setuptools' own work) is not an edge.
    """

    SMOOTHING = 0.1  # weight of each new interval in the average time per edge
    CLAMP = 4.0  # an interval counts as at most 4x (at least 1/4) the average so far

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._first: float | None = None
        self._finished_total = 0  # edges of the runs before the current one
        self._runs = 0
        self._last: tuple[int, int] | None = None  # (done, total) of the current run
        self._last_time = 0.0
        self._per_edge: float | None = None
        self.latest: Progress | None = None

    def feed(self, line: str) -> Progress | None:
        match = NINJA_RE.match(line)
        if match:
            done, total = int(match["done"]), int(match["total"])
        else:
            match = MAKE_RE.match(line)
            if not match:
                return None
            done, total = min(int(match["percent"]), 100), 100
        if total <= 0 or done > total:
            return None
        now = self._clock()
        if self._first is None:
            self._first = now
        if self._last is None or total != self._last[1] or done < self._last[0]:
            # A new run: what the previous one counted is finished; its first edge took an unknown time.
            self._finished_total += self._last[1] if self._last is not None else 0
            self._runs += 1
        else:
            finished = done - self._last[0]
            if finished > 0:
                sample = (now - self._last_time) / finished
                if self._per_edge is None:
                    self._per_edge = sample
                else:  # an outlier counts as at most CLAMP times the average, then is averaged in
                    sample = min(max(sample, self._per_edge / self.CLAMP), self._per_edge * self.CLAMP)
                    self._per_edge += self.SMOOTHING * (sample - self._per_edge)
        self._last, self._last_time = (done, total), now
        all_done, all_total = self._finished_total + done, self._finished_total + total
        eta = self._per_edge * (all_total - all_done) if self._per_edge is not None else None
        if all_done == all_total:
            eta = 0.0
        self.latest = Progress(all_done, all_total, now - self._first, eta, self._runs)
        return self.latest


# Phases inside a wheel step, in order. The step starts in "configure" (build front-end set-up, CMake's
# configure); the compile starts when CMake has written the build files, setuptools runs build_ext or
# scikit-build-core builds the project (ninja prints an edge when it *finishes*, so its first line comes
# late), else at the first progress line; packaging starts "wheel".
PHASES = ("configure", "compile", "wheel")
COMPILE_RE = re.compile(
    r"^(-- Build files have been written to|running build_ext\b|\*\*\* Building project with)"
)
WHEEL_RE = re.compile(
    r"^(installing to \S*bdist|creating '.*\.whl'|\*\*\* (Installing project into wheel|Making wheel))"
)


class PhaseTracker:
    """Seconds spent in each phase of a wheel step: configure, compile (ninja/Make), wheel (packaging).

    Phases only move forward: a second CMake run inside the compile (PyTorch re-runs CMake from ninja when
    a CMakeLists.txt changed) is part of the compile.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._index = 0
        self._since = clock()
        self.seconds: dict[str, float] = {}

    @property
    def phase(self) -> str:
        return PHASES[self._index]

    def feed(self, line: str) -> str | None:
        """The new phase when ``line`` starts one, else None."""
        if NINJA_RE.match(line) or MAKE_RE.match(line) or COMPILE_RE.match(line):
            target = 1
        elif WHEEL_RE.match(line):
            target = 2
        else:
            return None
        if target <= self._index:
            return None
        self._close()
        self._index = target
        return self.phase

    def finish(self) -> dict[str, float]:
        self._close()
        return dict(self.seconds)

    def _close(self) -> None:
        now = self._clock()
        self.seconds[self.phase] = round(self.seconds.get(self.phase, 0.0) + now - self._since, 3)
        self._since = now
