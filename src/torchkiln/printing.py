"""The one way torchkiln prints through Rich, and it prints literal text.

Rich reads ``[word]`` in a string as a style tag and ``:name:`` as an emoji code, and drops them: a message
that names a TOML table (``[deploy] system_libraries = [...]``), a path, a regex or a user's value would lose
text. So every console comes from :func:`make_console` (markup and emoji off, no highlighting, lines never
wrapped or cropped: the terminal wraps them), everything printed is a :class:`rich.text.Text` made here
(:func:`say`: plain parts and ``(text, style)`` parts, so a style never comes from a string), tables are
:class:`LiteralTable` (cells, headers and title as text, folded and never cut) and progress columns
:func:`text_column` (markup off). Nothing else imports rich (tests/test_messages_literal.py checks the
source), so a new message cannot take another path.
"""

from __future__ import annotations

from typing import IO, Any

from rich.console import Console, RenderableType
from rich.progress import BarColumn, Progress, TaskID, TaskProgressColumn, TextColumn
from rich.table import Column, Table
from rich.text import Text

__all__ = [
    "BarColumn",
    "Console",
    "LiteralTable",
    "Part",
    "Progress",
    "TaskID",
    "TaskProgressColumn",
    "make_console",
    "say",
    "show",
    "text",
    "text_column",
]

Part = str | tuple[str, str]  # plain text, or (text, style): the style is torchkiln's, never the text's


def make_console(
    *, stderr: bool = False, file: IO[str] | None = None, width: int | None = None, **options: Any
) -> Console:
    """A console that prints what it is given, character for character."""
    return Console(
        stderr=stderr,
        file=file,
        width=width,
        markup=False,
        emoji=False,
        highlight=False,
        soft_wrap=True,
        **options,
    )


def text(*parts: Part) -> Text:
    """Literal text from plain and ``(text, style)`` parts."""
    return Text.assemble(*parts)


def say(console: Console, *parts: Part) -> None:
    """Print one message: literal whatever console it is (one made elsewhere may have markup on), never
    wrapped or cropped."""
    console.print(text(*parts), soft_wrap=True)


def show(console: Console, renderable: RenderableType) -> None:
    """Print a table or other renderable made here (a :class:`LiteralTable`)."""
    console.print(renderable)


class LiteralTable(Table):
    """A table whose title, headers and cells are literal text, a cell too long for its column folded onto
    the next line (Rich's default cuts it with an ellipsis)."""

    def __init__(self, *headers: str, title: str | None = None) -> None:
        super().__init__(title=Text(title) if title is not None else None)
        for header in headers:
            self.add_column(Text(header), overflow="fold")

    def add_row(
        self, *renderables: RenderableType | None, style: Any = None, end_section: bool = False
    ) -> None:
        cells = [Text(cell) if isinstance(cell, str) else cell for cell in renderables]
        super().add_row(*cells, style=style, end_section=end_section)


def text_column(template: str) -> TextColumn:
    """A progress bar's text column: the task's fields inserted as they are, never read as markup, folded
    onto another line rather than cut where the terminal is too narrow."""
    return TextColumn(template, markup=False, table_column=Column(overflow="fold"))
