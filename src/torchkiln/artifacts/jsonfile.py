"""Typed JSON documents: dataclasses written as JSON and read back, every problem named by file and field.

The lock file and the manifest are read by later steps and other tools (``torchkiln verify --manifest``, the
images), so each is a dataclass with a format number, written by :func:`write` and read by :func:`load`,
which checks the format and every field's type and reports all problems at once, one line each, like a bad
recipe: ``dist/manifest.json: wheels[0].sha256: expected a string, got null``.

Field types understood: ``str``, ``int``, ``float``, ``bool``, ``Any``, ``X | None``, ``Literal[...]``,
``list[X]``, ``tuple[X, ...]``, ``dict[str, X]`` and nested dataclasses. Keys a document has and its
dataclass does not are ignored (a newer writer may add some); missing keys take the field's default.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from torchkiln.errors import DocumentError, Problem
from torchkiln.files import atomic

T = TypeVar("T")

_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}


def to_data(value: Any) -> Any:
    """A dataclass (recursively) as JSON-ready data: dicts in field order, tuples as lists, paths as text."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_data(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def from_data(cls: type[T], data: Any, *, file: str) -> T:
    """Build ``cls`` from ``data``; raises :class:`DocumentError` listing every problem."""
    problems: list[Problem] = []
    result = _convert(cls, data, "", file, problems)
    if problems:
        raise DocumentError(problems)
    return typing.cast(T, result)


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number"}.get(
        type(value), type(value).__name__
    )


def _type_name(tp: Any) -> str:
    if tp in _NAMES:
        return _NAMES[tp]
    if tp is type(None):
        return "null"
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        return " or ".join(_type_name(option) for option in typing.get_args(tp))
    if dataclasses.is_dataclass(tp):
        return "an object"
    origin = typing.get_origin(tp)
    if origin in (list, tuple):
        return "an array"
    if origin in (dict, Mapping):
        return "an object"
    return str(tp)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _convert(tp: Any, value: Any, path: str, file: str, problems: list[Problem]) -> Any:
    field = path or "<document>"
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        real = [o for o in options if o is not type(None)]
        if len(real) == 1:
            return _convert(real[0], value, path, file, problems)
        problems.append(
            Problem(file, field, f"unexpected {_describe(value)}", " or ".join(map(_type_name, real)))
        )
        return None
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            problems.append(Problem(file, field, f"{value!r} is not allowed", ", ".join(map(repr, allowed))))
        return value
    if dataclasses.is_dataclass(tp):
        return _object(tp, value, path, file, problems)
    if origin in (list, tuple):
        if not isinstance(value, list):
            problems.append(Problem(file, field, f"expected an array, got {_describe(value)}"))
            return [] if origin is list else ()
        item = typing.get_args(tp)[0] if typing.get_args(tp) else Any
        items = [_convert(item, v, f"{path}[{i}]", file, problems) for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin in (dict, Mapping):
        if not isinstance(value, dict):
            problems.append(Problem(file, field, f"expected an object, got {_describe(value)}"))
            return {}
        item = typing.get_args(tp)[1] if typing.get_args(tp) else Any
        return {k: _convert(item, v, _join(path, str(k)), file, problems) for k, v in value.items()}
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in _NAMES:
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            problems.append(Problem(file, field, f"expected {_NAMES[tp]}, got {_describe(value)}"))
        return value
    raise TypeError(f"document field type {tp!r} is not supported")  # a programming error, not input


def _object(cls: Any, value: Any, path: str, file: str, problems: list[Problem]) -> Any:
    if not isinstance(value, dict):
        problems.append(Problem(file, path or "<document>", f"expected an object, got {_describe(value)}"))
        return None
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in value:
            kwargs[f.name] = _convert(hints[f.name], value[f.name], _join(path, f.name), file, problems)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            problems.append(Problem(file, _join(path, f.name), "missing", _type_name(hints[f.name])))
            kwargs[f.name] = None  # reported: the object is discarded with the error
    return cls(**kwargs)


def read(path: Path, cls: type[T], *, what: str, version: int) -> T:
    """Read ``path`` as a ``cls`` document of format ``version``. Raises :class:`DocumentError` (exit 2)
    naming the file and each bad field: a missing file, invalid JSON, another format, a wrong field."""
    file = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DocumentError(
            [Problem(file, "<file>", "no such file", f"a {what} written by torchkiln")]
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise DocumentError([Problem(file, "<file>", f"cannot read: {reason}", "a readable file")]) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DocumentError([Problem(file, "<document>", f"invalid JSON: {exc}", f"a {what}")]) from None
    found = data.get("format") if isinstance(data, dict) else None
    if found != version:
        raise DocumentError(
            [
                Problem(
                    file,
                    "format",
                    f"{what} format {found!r} is not the one this torchkiln reads",
                    f"{version}; write it again with this torchkiln",
                )
            ]
        )
    return from_data(cls, data, file=file)


def write(path: Path, document: Any) -> None:
    """``document`` (a dataclass) as JSON at ``path``, atomically."""
    atomic.write_json(path, to_data(document))
