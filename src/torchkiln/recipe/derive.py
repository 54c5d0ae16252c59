"""A recipe made from another for other Pythons: ``torchkiln recipe new RECIPE --python 3.13``.

A shipped recipe pins one Python (the CPU recipe: 3.11, what Debian 12 packages); Debian 13 packages 3.13 only,
Ubuntu 24.04 3.12. Rather than an override on every command (which the manifest, the lock file, the provenance
and the images would each have to carry beside the recipe), the user makes the recipe for this host once: the
same file with ``python.version`` (or ``python.versions``) and ``recipe.name`` changed, and a header saying
what it was made from (path and sha256) and what changed. The build's records then name a recipe file that
says exactly what was built, and ``recipe check``, ``plan``, ``images`` and ``docker-bake.json`` take it as
any other recipe.

The text is edited in place where the recipe writes a ``[python]`` and a ``[recipe]`` table (every shipped
recipe does), so its comments stay; any other layout (dotted keys, inline tables) is written anew from the
parsed document. Either way the result is loaded and checked (every field, every rule: a Python the torch
release does not support is refused by ``python.version``) before anything is written, and must say what was
asked.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tomli_w

from torchkiln.errors import Problem, RecipeError, UsageError
from torchkiln.shipped import tomllib

from .loader import parse_recipe
from .model import Recipe
from .validators import NAME_RE

PYTHON_RE = re.compile(r"^3\.\d{1,2}t?$")
# a name's Python part: "-py311", "-py313t" (before the next '-' or at the end)
NAME_PYTHON = re.compile(r"-py3\d{1,2}t?(?=-|$)")
_TABLE = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\"-]+)\s*\]\s*(#.*)?$")


@dataclass(frozen=True)
class Derived:
    """The new recipe: its text, what it is, and what it was made from."""

    text: str
    recipe: Recipe
    source: Recipe


def python_tag(pythons: Sequence[str]) -> str:
    """``py313``, ``py312-py313``: how shipped recipe names say their Pythons."""
    return "-".join("py" + p.replace(".", "") for p in pythons)


def derived_name(name: str, pythons: Sequence[str]) -> str:
    """The source's name with its Python part replaced (``torch-2.13-cpu-py311`` -> ``torch-2.13-cpu-py313``),
    or the Python part appended to a name without one."""
    tag = python_tag(pythons)
    replaced, count = NAME_PYTHON.subn(f"-{tag}", name, count=1)
    return replaced if count else f"{name}-{tag}"


def _quoted(value: str) -> str:
    return tomli_w.dumps({"x": value}).partition("=")[2].strip()


def _python_line(pythons: Sequence[str]) -> str:
    if len(pythons) == 1:
        return f"version = {_quoted(pythons[0])}"
    return "versions = [" + ", ".join(_quoted(p) for p in pythons) + "]"


def _edit_table(lines: list[str], table: str, keys: dict[str, str | None]) -> bool:
    """In ``[table]``: each key of ``keys`` set to its line (None: removed), lines of an array value that
    runs over several lines included; a key the table lacks is added after its header. False when the file
    has no such table header (another layout)."""
    starts = [i for i, line in enumerate(lines) if (m := _TABLE.match(line)) and m.group(1) == table]
    if len(starts) != 1:
        return False
    start = starts[0]
    end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
    body = lines[start + 1 : end]
    kept: list[str] = []
    skipping = False
    done: set[str] = set()
    for line in body:
        if skipping:
            skipping = "]" not in line
            continue
        key = re.match(r"^\s*([A-Za-z0-9_-]+)\s*=\s*(.*)$", line)
        if key and key.group(1) in keys:
            name = key.group(1)
            skipping = key.group(2).startswith("[") and "]" not in key.group(2)
            if keys[name] is not None and name not in done:
                kept.append(str(keys[name]))
            done.add(name)
            continue
        kept.append(line)
    added = [line for name, line in keys.items() if line is not None and name not in done]
    lines[start + 1 : end] = added + kept
    return True


def _description(text: str, old: Sequence[str], new: Sequence[str]) -> str:
    """The description with "Python 3.11" said of the new Pythons, else with them added."""
    said = "Python " + ", ".join(new)
    for phrase in ("Python " + ", ".join(old), *(f"Python {p}" for p in old)):
        if phrase in text:
            return text.replace(phrase, said, 1)
    return f"{text}, {said}" if text else said


def for_pythons(source: Recipe, text: str, pythons: Sequence[str], name: str | None = None) -> Derived:
    """The recipe ``source`` (whose file says ``text``) for ``pythons``, named ``name`` (default:
    :func:`derived_name`). RecipeError when a Python or the name is malformed, or the result is refused by the
    recipe's rules (a Python the release does not support, ...): nothing is made then."""
    bad = [p for p in pythons if not PYTHON_RE.match(p)]
    if not pythons or bad or len(set(pythons)) != len(pythons):
        shown = ", ".join(map(repr, bad)) if bad else "none, or one given twice"
        raise UsageError(f"--python: {shown} (valid: MAJOR.MINOR such as 3.13 or 3.13t, each once)")
    new_name = name or derived_name(source.name, pythons)
    if not NAME_RE.fullmatch(new_name):
        raise UsageError(
            f"--name {new_name!r}: not a recipe name (valid: letters, digits, '.', '_', '-'; at most 80)"
        )
    was = list(source.python_versions)
    description = _description(source.description, was, pythons)
    lines = text.splitlines()
    python_keys: dict[str, str | None] = {"version": None, "versions": None}
    python_keys["version" if len(pythons) == 1 else "versions"] = _python_line(pythons)
    in_place = _edit_table(lines, "python", python_keys) and _edit_table(
        lines,
        "recipe",
        {"name": f"name = {_quoted(new_name)}", "description": f"description = {_quoted(description)}"},
    )
    if in_place:
        body = "\n".join(lines) + "\n"
    else:
        document: dict[str, Any] = tomllib.loads(text)
        document.setdefault("recipe", {}).update(name=new_name, description=description)
        python = document.setdefault("python", {})
        python.pop("version", None)
        python.pop("versions", None)
        python.update({"version": pythons[0]} if len(pythons) == 1 else {"versions": list(pythons)})
        body = tomli_w.dumps(document)
    origin = str(source.path) if source.path is not None else source.name
    header = textwrap.fill(
        f"Made by `torchkiln recipe new` from {origin} (sha256 {source.sha256}): python.version"
        f"{'s' if len(pythons) > 1 else ''} {', '.join(pythons)} instead of {', '.join(was)}, recipe.name "
        f"{new_name} instead of {source.name}. Everything else is that recipe's, its comments too: where they "
        f"speak of its Python, they speak of {', '.join(was)}.",
        width=110,
        initial_indent="# ",
        subsequent_indent="# ",
        break_on_hyphens=False,
        break_long_words=False,
    )
    header += "\n\n"
    result = header + body
    recipe = parse_recipe(result.encode(), f"--python {', '.join(pythons)}")
    if recipe.python_versions != tuple(pythons) or recipe.name != new_name:
        raise RecipeError(
            [
                Problem(
                    origin,
                    "python.version",
                    "is laid out in a way torchkiln could not edit",
                    "a recipe with a [recipe] and a [python] table",
                )
            ]
        )
    return Derived(result, recipe, source)
