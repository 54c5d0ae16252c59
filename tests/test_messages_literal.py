"""No user-facing text is read as markup (issue 46): every message template of the project, collected from the
code, printed through each of torchkiln's Rich paths with hostile values, comes out verbatim.

The templates are collected, not listed: every f-string of src/torchkiln (each replacement field filled with a
hostile value: ``[deploy]``, ``[bold]``, ``\\``, ``%s``, ``{}``, ``:smile:``, ...), every other string literal
that is not a docstring and reads as words (it holds a space), and every string of the data files messages
are made from (src/torchkiln/data/*.toml: the fix hints, the compat notes). The paths are every way
torchkiln prints through Rich (:mod:`torchkiln.printing`, the only module that imports rich): the build
display's warning, note, step line, resume lines and live progress bar, a message of a command (``say``) and
each part of a table (title, header, cell)."""

from __future__ import annotations

import ast
import io
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import tomllib
from kit import ROOT

from torchkiln import printing
from torchkiln.build.display import Display
from torchkiln.build.progress import Progress as CompileCounts
from torchkiln.plan.model import Step

SRC = ROOT / "src" / "torchkiln"
# What Rich would read as markup or emoji, and what printf- and format-style formatting would read: each
# must come out as it went in.
HOSTILE = (
    "[deploy]",
    "[bold]x[/bold]",
    "a]b[c",
    "\\",
    "\\[red]",
    "%s",
    "{}",
    "{0}",
    ":smile:",
    "[/]",
    "[link=http://x]y[/link]",
    "[red",
)


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _filled(node: ast.JoinedStr, start: int) -> str:
    """The f-string as it prints with each replacement field a hostile value (taken in turn from ``start``)."""
    parts = []
    fields = 0
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value))
        else:
            parts.append(HOSTILE[(start + fields) % len(HOSTILE)])
            fields += 1
    return "".join(parts)


def _toml_strings(data: object) -> Iterator[str]:
    if isinstance(data, str):
        yield data
    elif isinstance(data, dict):
        for value in data.values():
            yield from _toml_strings(value)
    elif isinstance(data, list):
        for value in data:
            yield from _toml_strings(value)


def templates() -> list[tuple[str, str]]:
    """(where, the text as printed) for every message template of the project (see the module docstring)."""
    found: list[tuple[str, str]] = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        inside: set[int] = set()
        where = path.relative_to(ROOT)
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                inside.update(id(child) for child in ast.walk(node))
                found.append((f"{where}:{node.lineno}", _filled(node, len(found))))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and " " in node.value
                and id(node) not in docs | inside
            ):
                found.append((f"{where}:{node.lineno}", node.value))
    for path in sorted((SRC / "data").glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        found += [(str(path.relative_to(ROOT)), text) for text in _toml_strings(data) if " " in text]
    return found


TEMPLATES = [(where, text) for where, text in templates() if text.strip()]
BOX = re.compile(r"[\s\u2500-\u257f]+")  # whitespace (a folded line) and box drawing (a table's rules)


def squeezed(text: str) -> str:
    return BOX.sub("", text)


def console(out: io.StringIO, *, terminal: bool = False, width: int = 100) -> printing.Console:
    return printing.make_console(file=out, width=width, force_terminal=terminal)


def step_named(name: str) -> Step:
    return Step(name, "compile", "torch", ("true",))


def _progress_bar(display: Display, out: io.StringIO, text: str) -> None:
    """The live bar of a compile named ``text``, drawn once into ``out`` (wide: a narrower one folds the name
    beside the bar's other columns, which a verbatim match cannot read back; a step's name is one line)."""
    display.live_bar(step_named(text.replace("\n", " ")))
    bar = display._progress  # noqa: SLF001 - the bar as drawn, not a copy of its columns
    assert bar is not None
    display.compile_progress(CompileCounts(1, 2, 1.0, 1.0))
    printing.show(console(out, width=2000), bar.get_renderable())
    display.stop_live()


def _table(out: io.StringIO, text: str) -> None:
    """``text`` as title, header and cell of a table of two columns (the other one empty: a folded cell's
    lines are read back in order)."""
    table = printing.LiteralTable(text, "", title=text)
    table.add_row(text, "")
    printing.show(console(out), table)


# Each way torchkiln prints through Rich: a callable printing ``text`` into ``out``, and how many times the
# text must be found there.
PATHS: dict[str, tuple[Callable[[io.StringIO, str], None], int]] = {
    "display.warn": (lambda out, t: Display(console(out)).warn(t), 1),
    "display.note": (lambda out, t: Display(console(out)).note(t), 1),
    "display.start_step": (lambda out, t: Display(console(out)).start_step(1, 2, step_named(t)), 1),
    "display.resume": (lambda out, t: Display(console(out)).resume([t], t), 1),
    "display.phase": (lambda out, t: Display(console(out)).phase(t), 1),
    "display.end_step": (lambda out, t: Display(console(out)).end_step(step_named(t), t, 1.0), 1),
    "display.live_bar": (lambda out, t: _progress_bar(Display(console(out, terminal=True)), out, t), 1),
    "printing.say": (lambda out, t: printing.say(console(out), t), 1),
    "printing.LiteralTable": (_table, 3),
}


def test_the_templates_are_collected_from_the_code() -> None:
    """The collection finds the messages of the issue, the ones whose text Rich ate among them."""
    texts = [text for _, text in TEMPLATES]
    assert len(texts) > 2000, len(texts)
    assert any(t.startswith("[deploy] system_libraries = [") for t in texts)
    assert any(t.startswith("--skip-postcheck: the post-build check would have refused it: ") for t in texts)


@pytest.mark.parametrize("path", list(PATHS))
def test_every_template_prints_verbatim(path: str) -> None:
    """Every template through one path: the output holds it, character for character (whitespace and a
    table's rules aside: a table folds a long cell onto the next lines)."""
    render, count = PATHS[path]
    lost = []
    for where, text in TEMPLATES:
        out = io.StringIO()
        render(out, text)
        if squeezed(out.getvalue()).count(squeezed(text)) < count:
            lost.append(f"{where}: {text!r} printed as {out.getvalue()!r}")
    assert not lost, f"{len(lost)} of {len(TEMPLATES)} templates lost text, e.g.:\n" + "\n".join(lost[:5])


@pytest.mark.parametrize("value", HOSTILE)
def test_a_hostile_value_alone_prints_verbatim(value: str) -> None:
    for path, (render, count) in PATHS.items():
        out = io.StringIO()
        render(out, value)
        assert squeezed(out.getvalue()).count(squeezed(value)) >= count, (path, out.getvalue())


def _imports(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def test_only_the_printing_module_imports_rich() -> None:
    """One choke point: a module that printed through Rich itself could forget to print literally."""
    others = [
        str(path.relative_to(ROOT))
        for path in sorted(SRC.rglob("*.py"))
        if path != SRC / "printing.py"
        and any(
            name == "rich" or name.startswith("rich.")
            for name in _imports(ast.parse(path.read_text(encoding="utf-8")))
        )
    ]
    assert others == [], f"these modules import rich: print through torchkiln.printing instead: {others}"


@pytest.mark.parametrize("value", ["[red]w[/red]", "[deploy]", "a\\[b]", "[bold]x[/bold]"])
def test_the_commands_print_a_users_values_verbatim(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """End to end: ``torchkiln plan`` (its tables) and ``torchkiln cache show`` given paths that hold markup."""
    from torchkiln.cli import main

    where = tmp_path / value
    recipe = ROOT / "recipes" / "torch-2.13-cpu-py311.toml"
    assert main(["plan", str(recipe), "--workdir", str(where / "work"), "--dist", str(where / "dist")]) == 0
    shown = capsys.readouterr().out
    assert squeezed(str(where / "work")) in squeezed(shown), shown[-2000:]
    assert main(["cache", "show", "--cache", "ccache", "--cache-dir", str(where / "cache")]) == 0
    shown = capsys.readouterr().out
    assert f"cache: ccache in {where / 'cache'}" in shown, shown
