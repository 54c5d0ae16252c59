"""Compile progress from build output: ninja's ``[done/total]`` (and Make's ``[ NN%]``) as percent and ETA.

PyTorch builds with ninja (CMAKE_GENERATOR=Ninja) and torch.utils.cpp_extension uses ninja too, so the
compile stage of both torch and torchvision prints ``[123/4567] Building CXX object ...``. The ETA is the
average time per finished edge so far times the edges left: crude, but it is what a user wants to know
three hours into a build.
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
    done: int
    total: int
    elapsed: float  # seconds since this ninja run printed its first edge
    eta: float | None  # seconds left, None until there is a rate to extrapolate from

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 0.0

    @property
    def percent(self) -> float:
        return 100.0 * self.fraction

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

    A build may run several ninja invocations in a row (torch's CMake build, then an extension): when the
    counter restarts or the total changes, the rate is measured afresh.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._start: float | None = None
        self._start_done = 0
        self._last: tuple[int, int] | None = None
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
        if self._last is None or total != self._last[1] or done < self._last[0]:
            # A new run: measure the rate from here (its first edge already took an unknown time).
            self._start, self._start_done = now, done
        self._last = (done, total)
        assert self._start is not None
        elapsed = now - self._start
        finished = done - self._start_done
        eta = elapsed / finished * (total - done) if finished > 0 and elapsed > 0 else None
        if done == total:
            eta = 0.0
        self.latest = Progress(done, total, elapsed, eta)
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
