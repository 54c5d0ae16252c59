"""What reads a step's output line by line as it arrives (:func:`torchkiln.process.runner.stream`): the base
:class:`LineObserver`, the post-build check's :class:`InstalledObserver` and the compile's
:class:`CompileObserver`. Apart from the kinds that make them: an observer holds what it is given (the
display, the watchers, the jobs), never the step or the context.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torchkiln.process.runner import in_context

from .display import Display
from .envstore import EnvStore
from .postcheck import INSTALLED
from .progress import CompileProgress, PhaseTracker
from .watch import Contradiction, Watcher


class LineObserver:
    """Reads a step's output line by line (runner.stream); True from ``__call__`` stops the step."""

    stopped = "stopped"  # how a stop on :meth:`verdict` is described

    def __call__(self, line: str) -> bool:
        return False

    def verdict(self) -> list[Contradiction] | None:
        """Contradictions that stopped (or, at the end of the output, would stop) the step."""
        return None

    def phases(self) -> dict[str, float] | None:
        return None


class InstalledObserver(LineObserver):
    """The post-build check's output: at its line saying pip has installed the wheels
    (:data:`~torchkiln.build.postcheck.INSTALLED`), ``jobs`` run, each in a thread of its own, beside the
    check's import of them (issue 38): each reads the installed files, which the import does not change
    (staging may replace a large file by a link to the store's identical copy: the other reads the same
    content either way). Side by side since issue 47: once the check's interpreter has imported torch during the
    compile, the check's import takes a tenth of a second, and the jobs one after the other were its end)."""

    def __init__(self, jobs: Mapping[str, Callable[[], Any]]) -> None:
        self.jobs = dict(jobs)
        self.threads: list[threading.Thread] = []
        self.found: dict[str, Any] = {}
        self.errors: dict[str, BaseException] = {}

    def __call__(self, line: str) -> bool:
        if not self.threads and line.rstrip("\n") == INSTALLED:
            for name, job in self.jobs.items():
                thread = threading.Thread(target=in_context(self._run), args=(name, job), name=f"after-install-{name}", daemon=True)  # fmt: skip
                self.threads.append(thread)
                thread.start()
        return False

    def _run(self, name: str, job: Callable[[], Any]) -> None:
        try:
            self.found[name] = job()
        except BaseException as exc:  # noqa: BLE001 - raised again in the builder's thread (results)
            self.errors[name] = exc

    def wait(self) -> dict[str, Any]:
        """What the jobs returned, once they are done (none: the line never came)."""
        for thread in self.threads:
            thread.join()
        return self.found

    def results(self) -> dict[str, Any]:
        """:meth:`wait`, a job's exception raised here (the first in ``jobs``' order; what was staged
        discarded)."""
        found = self.wait()
        if self.errors:
            EnvStore.discard(found.get("staged"))
            raise next(self.errors[name] for name in self.jobs if name in self.errors)
        return found


class CompileObserver(LineObserver):
    """ninja's progress to the display, the wheel step's phases, and the watchers of its configuration."""

    def __init__(self, display: Display, watchers: Sequence[Watcher]) -> None:
        self.display = display
        self.watchers = tuple(watchers)
        self.progress = CompileProgress()
        self.tracker = PhaseTracker()
        self.mismatch: list[Contradiction] | None = None

    def __call__(self, line: str) -> bool:
        entered = self.tracker.feed(line)
        if entered is not None:
            self.display.phase(entered)
        p = self.progress.feed(line)
        if p is not None:
            self.display.compile_progress(p)
        for watcher in self.watchers:
            verdict = watcher.feed(line)
            if verdict:
                self.mismatch, self.stopped = verdict, watcher.what
                return True
        return False

    def verdict(self) -> list[Contradiction] | None:
        for watcher in self.watchers:
            if self.mismatch is not None:
                break
            verdict = watcher.close()
            if verdict:
                self.mismatch, self.stopped = verdict, watcher.what
        return self.mismatch

    def phases(self) -> dict[str, float] | None:
        return self.tracker.finish()
