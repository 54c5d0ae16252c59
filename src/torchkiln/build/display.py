"""What a build shows while it runs: one line per step; during a compile a progress bar (ninja's edges over
all of the project's ninja runs, the bar's percentage once, a smoothed ETA). On a terminal the bar is live;
elsewhere (CI logs) a progress line is printed every 10 %. Once the build's final message is due
(:meth:`Display.close`), nothing is drawn any more: no bar below a failure's ``full log:`` line."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TaskProgressColumn, TextColumn

from torchkiln.plan.model import Step

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
        self.console.print(f"[bold]{index}/{count}[/bold] [cyan]{step.kind}[/cyan] {step.name}")
        self._last_decile = -1
        self._label = ""

    def live_bar(self, step: Step) -> None:
        """A compile runs: a live bar on a terminal (elsewhere progress lines)."""
        if self.console.is_terminal and not self._closed:
            self._progress = Progress(
                TextColumn("  {task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                TextColumn("{task.fields[detail]}"),
                console=self.console,
                transient=True,
            )
            name = f"{step.name} ({self._label})" if self._label else step.name
            self._task = self._progress.add_task(escape(name), total=None, detail="starting")
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
            self.console.print(f"  compile{label} {p.describe()}")

    def phase(self, name: str) -> None:
        """A wheel step entered a new phase (configure, compile, wheel)."""
        if self._closed:
            return
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, detail=name)
        else:
            self.console.print(f"  {name}")

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
            self.console.print(f"  [yellow]{escape(line)}[/yellow]")
        self._label = label
        self._last_decile = -1

    def close(self) -> None:
        """The build's final message comes next: stop the live bar for good."""
        self.stop_live()
        self._closed = True

    def end_step(self, step: Step, status: str, seconds: float) -> None:
        self.stop_live()
        mark = {
            "ran": "[green]done[/green]",
            "skipped": "[dim]unchanged, skipped[/dim]",
            "reused": "[green]reused[/green] from the environment store",
        }.get(status, status)
        timed = status in ("ran", "reused")
        self.console.print(f"  {mark} ({format_duration(seconds)})" if timed else f"  {mark}")

    def note(self, text: str) -> None:
        self.console.print(f"  {text}")

    def warn(self, text: str) -> None:
        self.console.print(f"[yellow]warning:[/yellow] {text}")
