"""What a build shows while it runs: one line per step; during a compile a progress bar (ninja's edges over
all of the project's ninja runs, the bar's percentage once, a smoothed ETA). On a terminal the bar is live;
elsewhere (CI logs) a progress line is printed every 10 %. Once the build's final message is due
(:meth:`Display.close`), nothing is drawn any more: no bar below a failure's ``full log:`` line. Everything it
prints is literal text (:mod:`torchkiln.printing`): a step's name, a warning, a note print as they are."""

from __future__ import annotations

from torchkiln.plan.model import Step
from torchkiln.printing import (
    BarColumn,
    Console,
    Part,
    Progress,
    TaskID,
    TaskProgressColumn,
    say,
    text_column,
)

from .progress import Progress as CompileCounts
from .progress import format_duration


class Display:
    def __init__(self, console: Console) -> None:
        self.console = console
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._last_decile = -1
        self._closed = False
        self._label = ""  # what a resumed compile step's progress says of it: "retry 1/3, MAX_JOBS=1"

    def start_step(self, index: int, count: int, step: Step) -> None:
        self._say((f"{index}/{count}", "bold"), " ", (step.kind, "cyan"), f" {step.name}")
        self._last_decile = -1
        self._label = ""

    def live_bar(self, step: Step) -> None:
        """A compile runs: a live bar on a terminal (elsewhere progress lines)."""
        if self.console.is_terminal and not self._closed:
            self._progress = Progress(
                text_column("  {task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                text_column("{task.fields[detail]}"),
                console=self.console,
                transient=True,
            )
            name = f"{step.name} ({self._label})" if self._label else step.name
            self._task = self._progress.add_task(name, total=None, detail="starting")
            self._progress.start()

    def compile_progress(self, p: CompileCounts) -> None:
        if self._closed:
            return
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=p.done, total=p.total, detail=p.counts())
            return
        decile = int(p.percent // 10)
        if decile > self._last_decile:
            self._last_decile = decile
            label = f" ({self._label})" if self._label else ""
            self._say(f"  compile{label} {p.describe()}")

    def phase(self, name: str) -> None:
        """A wheel step entered a new phase (configure, compile, wheel)."""
        if self._closed:
            return
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, detail=name)
        else:
            self._say(f"  {name}")

    def stop_live(self) -> None:
        """End a live bar (also when its step failed: the terminal is left clean for the error)."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def resume(self, lines: list[str], label: str) -> None:
        """A compile step resumes after compiles died for memory: say why and how, and label its progress
        from now on (``label``: the retry and its jobs)."""
        self.stop_live()
        for line in lines:
            self._say("  ", (line, "yellow"))
        self._label = label
        self._last_decile = -1

    def close(self) -> None:
        """The build's final message comes next: stop the live bar for good."""
        self.stop_live()
        self._closed = True

    def end_step(self, step: Step, status: str, seconds: float) -> None:
        self.stop_live()
        mark: tuple[Part, ...] = {
            "ran": (("done", "green"),),
            "skipped": (("unchanged, skipped", "dim"),),
            "reused": (("reused", "green"), " from the environment store"),
        }.get(status, (status,))
        timed = status in ("ran", "reused")
        self._say("  ", *mark, f" ({format_duration(seconds)})" if timed else "")

    def note(self, text: str) -> None:
        self._say(f"  {text}")

    def warn(self, text: str) -> None:
        self._say(("warning:", "yellow"), f" {text}")

    def _say(self, *parts: Part) -> None:
        say(self.console, *parts)
