"""Recipes: one TOML file pins one build.

Loading a recipe is one pass that reports every problem it finds (never just the first): the document is
checked against :data:`~torchkiln.recipe.schema.SCHEMA` (unknown keys, wrong types, malformed values), built
into the typed :class:`~torchkiln.recipe.model.Recipe` (each value where its :class:`~.schema.Field` says) and
checked by the compatibility rules of :mod:`torchkiln.recipe.rules` (torch <-> torchvision, Python, CUDA,
cuDNN, arch list, gcc, MAGMA, ...): every rule whose fields are usable runs, so a malformed field does not
hide another's problem. Also here: where recipes are found (a path, or a shipped recipe's name).

Any problem raises :class:`~torchkiln.errors.RecipeError` with one line per problem:
``FILE: field.path: what is wrong (valid: ...)``.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import re
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchkiln.errors import Problem, RecipeError
from torchkiln.shipped import tomllib

from .model import Recipe
from .rules import check_rules
from .schema import (
    FIELDS,
    FREE_TEXT,
    OPTIONAL_SECTIONS,
    PLACEHOLDERS,
    RENAMED_TABLES,
    REQUIRED_TABLES,
    SCHEMA,
    SECTIONS,
    SUBTABLES,
    TABLES,
    TYPE_NAMES,
)
from .validators import SHOWN, plain_string

__all__ = [
    "load_recipe",
    "parse_recipe",
    "recipes_dir",
    "resolve_recipe_path",
]


def _flatten(doc: Mapping[str, Any]) -> dict[str, Any]:
    """recipe document -> {"table.key": value}; a declared subtable's keys become "table.sub.key", other
    nested tables below the second level stay values."""
    flat: dict[str, Any] = {}
    for table, content in doc.items():
        if isinstance(content, dict):
            for key, value in content.items():
                path = f"{table}.{key}"
                if path in SUBTABLES and isinstance(value, dict):
                    flat.update({f"{path}.{k}": v for k, v in value.items()})
                else:
                    flat[path] = value
        else:
            flat[table] = content
    return flat


_SIMPLE_KEY = re.compile(r"[A-Za-z0-9_-]+", re.ASCII)


def display_key(key: str) -> str:
    """A key as it appears in a problem line: bare when simple, else quoted and escaped so the line stays
    ``FILE: field: message`` (no raw colon, newline or empty field)."""
    if _SIMPLE_KEY.fullmatch(key) and len(key) <= SHOWN:  # not match(): "$" also matches before "\n"
        return key
    quoted = json.dumps(key[:SHOWN], ensure_ascii=True).replace(":", "\\u003a")
    return quoted if len(key) <= SHOWN else f"{quoted}...({len(key)} characters)"


def _type_ok(value: Any, expected: type) -> bool:
    # bool is an int subclass in Python; a recipe's `jobs = true` is still a type error.
    if isinstance(value, bool) and expected is not bool:
        return False
    return isinstance(value, expected)


def check_schema(doc: Mapping[str, Any], file: str) -> list[Problem]:
    """Unknown keys, missing required fields, wrong types and malformed values."""
    return schema_problems(doc, file)[0]


def _unknown_key(key: str) -> str:
    """ "unknown key", and the tables that have it where it is a key of another (``system_libraries``, put
    under ``[cache]``, belongs in ``[deploy]``): the way out of a key put under the wrong table."""
    homes = sorted({p.rsplit(".", 1)[0] for p in FIELDS if "." in p and p.rsplit(".", 1)[1] == key})
    return "unknown key" + (f" here; it is a key of [{'], ['.join(homes)}]" if homes else "")


def schema_problems(doc: Mapping[str, Any], file: str) -> tuple[list[Problem], set[str]]:
    """Every schema problem, and the field paths (or whole tables) they make unusable: the rules that read
    one of those are not run (they would only report consequences), every other rule is."""
    problems: list[Problem] = []
    bad: set[str] = set()
    for table, content in doc.items():
        if table not in TABLES:
            problems.append(Problem(file, display_key(table), "unknown table", ", ".join(sorted(TABLES))))
        elif not isinstance(content, dict):
            problems.append(
                Problem(file, table, f"must be a table, not {type(content).__name__}", f"[{table}]")
            )
            bad.add(table)
    for table in sorted(REQUIRED_TABLES - set(doc)):
        problems.append(Problem(file, table, "missing table", f"a [{table}] table"))
        bad.add(table)
    flat = _flatten({k: v for k, v in doc.items() if k in TABLES and isinstance(v, dict)})
    for path, value in flat.items():
        if path in SUBTABLES:  # not a table (flattening opened it otherwise)
            problems.append(Problem(file, path, f"must be a table, not {type(value).__name__}", f"[{path}]"))
            bad.add(path)
            continue
        spec = FIELDS.get(path)
        if spec is None:
            parent, key = path.rsplit(".", 1)
            if parent not in SUBTABLES:
                parent, key = path.split(".", 1)
            children = {p[len(parent) + 1 :].split(".")[0] for p in FIELDS if p.startswith(parent + ".")}
            problems.append(
                Problem(file, f"{parent}.{display_key(key)}", _unknown_key(key), ", ".join(sorted(children)))
            )
            continue
        if not _type_ok(value, spec.type):
            expected = TYPE_NAMES.get(spec.type, str(spec.type))
            problems.append(Problem(file, path, f"wrong type {type(value).__name__}", expected))
            bad.add(path)
            continue
        outcome = plain_string(value, text=spec.path in FREE_TEXT) if isinstance(value, str) else None
        if outcome is None and spec.check is not None:
            outcome = spec.check(value)
        if outcome is not None:
            problems.append(Problem(file, path, outcome[0], outcome[1]))
            bad.add(path)
    for spec in SCHEMA:
        table = spec.path.split(".")[0]
        if not isinstance(doc.get(table), dict):
            continue
        if spec.either is not None and spec.path in flat and spec.either in flat:
            problems.append(
                Problem(
                    file, spec.either, f"given with {spec.path}", f"{spec.path} or {spec.either}, not both"
                )
            )
            bad.add(spec.either)
        elif spec.required and spec.path not in flat and spec.either not in flat:
            problems.append(
                Problem(file, spec.path, "missing required key", spec.doc or TYPE_NAMES[spec.type])
            )
            bad.add(spec.path)
    return problems, bad


# The old table names this process has said the new name of: once each, however often a recipe is read.
_RENAME_SAID: set[str] = set()


def renamed_tables(doc: Mapping[str, Any], file: str) -> tuple[dict[str, Any], list[Problem]]:
    """``doc`` with each old table name of :data:`RENAMED_TABLES` read as its new one (saying so on stderr,
    once per process); a document with both spellings of a table is refused, naming both."""
    new_doc, problems = dict(doc), []
    for old, new in RENAMED_TABLES.items():
        if old not in doc:
            continue
        if new in doc:
            valid = f"[{new}] alone ([{old}] is its old name)"
            problems.append(Problem(file, old, f"given with [{new}]", valid))
            del new_doc[old]
            continue
        if old not in _RENAME_SAID:
            _RENAME_SAID.add(old)
            print(f"{file}: [{old}] is deprecated: it is now [{new}]", file=sys.stderr)
        new_doc = {(new if k == old else k): v for k, v in new_doc.items()}
    return new_doc, problems


def _build_recipe(doc: Mapping[str, Any], path: Path | None, digest: str) -> Recipe:
    """Typed recipe from a schema-valid document (check_schema returned no problems): every field goes
    where its :class:`Field` says, so a path is spelled once, in :data:`SCHEMA`."""
    flat = _flatten(doc)
    sections: dict[str, dict[str, Any]] = {table: {} for table in SECTIONS}
    top: dict[str, Any] = {}
    for spec in SCHEMA:
        default = spec.default_from(flat) if spec.default_from is not None else spec.default
        value = flat.get(spec.path, default)
        if value is None:
            continue
        owner, _, attr = (spec.to or spec.path).rpartition(".")
        (sections[owner] if owner else top)[attr] = spec.convert(value) if spec.convert else value
    for table, cls in SECTIONS.items():
        present = any(key.startswith(f"{table}.") for key in flat)
        if table in OPTIONAL_SECTIONS and not present:
            top[table] = None
            continue
        kwargs = sections[table]
        if "name" in {f.name for f in dataclasses.fields(cls)}:
            kwargs["name"] = table
        top[table] = cls(**kwargs)
    return Recipe(**top, path=path, sha256=digest, document=doc)


# Input limits, checked before parsing: a recipe is a few kilobytes; a document beyond these is a mistake
# (a wrong file, a generated one gone wrong), and parsing it would cost memory or the interpreter's stack.
MAX_BYTES = 256 * 1024
MAX_DEPTH = 8  # tables/arrays inside each other; a recipe needs 3 ([torchvision.features], build.flags)


def _depth(doc: Any) -> int:
    """How deeply tables and arrays nest in ``doc`` (iteratively: a deep document cannot exhaust the stack)."""
    deepest, stack = 0, [(doc, 0)]
    while stack:
        value, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        if isinstance(value, dict):
            stack += [(v, depth + 1) for v in value.values()]
        elif isinstance(value, list):
            stack += [(v, depth + 1) for v in value]
    return deepest


def _document_problem(file: str, message: str, valid: str) -> RecipeError:
    return RecipeError([Problem(file, "<document>", message, valid)])


def _unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for path, value in flat.items():
        *tables, key = path.split(".")
        node = doc
        for table in tables:
            node = node.setdefault(table, {})
        node[key] = value
    return doc


def _usable(doc: Mapping[str, Any], bad: set[str]) -> dict[str, Any]:
    """The document without its unusable fields (``bad``, unknown keys), required ones replaced by
    :data:`PLACEHOLDERS`: what the rules can still be run on while the schema's problems are reported."""
    flat = _flatten({k: v for k, v in doc.items() if k in TABLES and k not in bad and isinstance(v, dict)})
    kept = {
        path: value
        for path, value in flat.items()
        if path in FIELDS and not any(path == b or path.startswith(b + ".") for b in bad)
    }
    for path, value in PLACEHOLDERS.items():
        kept.setdefault(path, value)
    return _unflatten(kept)


def parse_recipe(data: bytes, file: str, path: Path | None = None) -> Recipe:
    """Parse and validate recipe bytes in one pass. Raises RecipeError listing every problem: the schema's,
    and those of every rule whose fields are usable (a malformed field does not hide another's problem)."""
    if len(data) > MAX_BYTES:
        raise _document_problem(
            file, f"{len(data)} bytes, larger than {MAX_BYTES}", f"a recipe under {MAX_BYTES // 1024} KiB"
        )
    digest = hashlib.sha256(data).hexdigest()
    if not data.strip():
        raise _document_problem(
            file,
            "empty recipe",
            "a TOML document with " + ", ".join(f"[{t}]" for t in sorted(REQUIRED_TABLES)),
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _document_problem(
            file, f"not UTF-8 text ({exc.reason} at byte {exc.start})", "a UTF-8 TOML file"
        ) from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _document_problem(file, f"invalid TOML: {str(exc)[:200]}", "TOML 1.0") from None
    except RecursionError:
        raise _document_problem(
            file, "arrays or tables nested too deeply", f"at most {MAX_DEPTH} levels"
        ) from None
    if _depth(doc) > MAX_DEPTH:
        raise _document_problem(file, "arrays or tables nested too deeply", f"at most {MAX_DEPTH} levels")
    doc, renames = renamed_tables(doc, file)
    problems, bad = schema_problems(doc, file)
    problems = renames + problems
    if not problems:
        recipe = _build_recipe(doc, path, digest)
        problems = check_rules(recipe, file)
    else:
        problems += check_rules(_build_recipe(_usable(doc, bad), path, digest), file, skip=bad)
    if problems:
        raise RecipeError(problems)
    return recipe


def read_limited(path: Path, what: str = "a recipe .toml") -> bytes:
    """The bytes of a regular file of at most :data:`MAX_BYTES` (a FIFO, a device, a directory or a huge
    file is refused before it is read: reading one would hang or exhaust memory)."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise RecipeError([Problem(str(path), "<file>", "no such file", f"a path to {what}")]) from None
    except OSError as exc:
        raise RecipeError(
            [Problem(str(path), "<file>", f"cannot read: {exc.strerror}", "a readable file")]
        ) from None
    if stat.S_ISDIR(info.st_mode):
        raise RecipeError([Problem(str(path), "<file>", "is a directory", f"a path to {what}")])
    if not stat.S_ISREG(info.st_mode):
        raise RecipeError([Problem(str(path), "<file>", "not a regular file", f"a path to {what}")])
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise RecipeError(
            [Problem(str(path), "<file>", f"cannot read: {exc.strerror}", "a readable file")]
        ) from None
    return data


def load_recipe(path: str | Path) -> Recipe:
    """Load and validate a recipe file. Raises RecipeError (exit 2 in the CLI) on any problem."""
    path = Path(path)
    return parse_recipe(read_limited(path), str(path), path)


def recipes_dir() -> Path:
    """The shipped recipes: ./recipes of a checkout (or TORCHKILN_RECIPES)."""
    env = os.environ.get("TORCHKILN_RECIPES")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "recipes"
        if candidate.is_dir() and any(candidate.glob("*.toml")):
            return candidate
    return Path.cwd() / "recipes"


def shipped_names() -> list[str]:
    """The names of the shipped recipes (their file names without ``.toml``), sorted."""
    return sorted(p.stem for p in recipes_dir().glob("*.toml"))


def resolve_recipe_path(name_or_path: str) -> Path:
    """A recipe given as a path, or as the name of a shipped recipe (with or without .toml). A bare name
    that is neither is refused listing the shipped recipes, the closest to it first (a misspelt name)."""
    path = Path(name_or_path)
    if path.exists() or path.suffix == ".toml" and "/" in name_or_path:
        return path
    shipped = recipes_dir() / (name_or_path if name_or_path.endswith(".toml") else f"{name_or_path}.toml")
    if shipped.exists() or "/" in name_or_path:
        return shipped if shipped.exists() else path
    names = shipped_names()
    closest = difflib.get_close_matches(name_or_path.removesuffix(".toml"), names, n=len(names), cutoff=0.0)
    raise RecipeError(
        [
            Problem(
                name_or_path,
                "<file>",
                f"no such file, and no shipped recipe of that name (in {recipes_dir()})",
                f"a path to a recipe .toml, or a shipped recipe, closest first: {', '.join(closest) or 'none'}",
            )
        ]
    )
