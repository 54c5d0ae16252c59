"""What a build shows while it runs: one line per step; during a compile a progress bar (ninja's percent and
ETA). On a terminal the bar is live; elsewhere (CI logs) a progress line is printed every 10 %."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TaskProgressColumn, TextColumn

from .plan import Step
from .progress import format_duration


class Display:
    def __init__(self, console: Console) -> None:
        self.console = console
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._last_decile = -1

    def start_step(self, index: int, count: int, step: Step) -> None:
        self.console.print(f"[bold]{index}/{count}[/bold] [cyan]{step.kind}[/cyan] {step.name}")
        self._last_decile = -1

    def live_bar(self, step: Step) -> None:
        """A compile runs: a live bar on a terminal (elsewhere progress lines)."""
        if self.console.is_terminal:
            self._progress = Progress(
                TextColumn("  {task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                TextColumn("{task.fields[detail]}"),
                console=self.console,
                transient=True,
            )
            self._task = self._progress.add_task(step.name, total=None, detail="starting")
            self._progress.start()

    def compile_progress(self, describe: str, done: int, total: int, percent: float) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=done, total=total, detail=describe)
            return
        decile = int(percent // 10)
        if decile > self._last_decile:
            self._last_decile = decile
            self.console.print(f"  compile {describe}")

    def phase(self, name: str) -> None:
        """A wheel step entered a new phase (configure, compile, wheel)."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, detail=name)
        else:
            self.console.print(f"  {name}")

    def stop_live(self) -> None:
        """End a live bar (also when its step failed: the terminal is left clean for the error)."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def end_step(self, step: Step, status: str, seconds: float) -> None:
        self.stop_live()
        mark = {"ran": "[green]done[/green]", "skipped": "[dim]unchanged, skipped[/dim]"}.get(status, status)
        self.console.print(f"  {mark} ({format_duration(seconds)})" if status == "ran" else f"  {mark}")

    def note(self, text: str) -> None:
        self.console.print(f"  {text}")

    def warn(self, text: str) -> None:
        self.console.print(f"[yellow]warning:[/yellow] {text}")
