"""The build knobs each torch release reads, and a check of a recipe's ``[build.flags]`` against them.

PyTorch forwards every ``USE_*`` / ``BUILD_*`` environment variable to CMake, so a misspelt flag or a value
CMake does not read as intended passes silently. ``data/cmake_options.toml`` lists, per supported torch minor
release, the options its top-level ``CMakeLists.txt`` declares and the environment-only knobs its build front
end reads, each with the upstream file and commit it was read from; ``data/host_tools.toml`` holds the
host-tool minimums, the host compilers each CUDA version's nvcc accepts and where torchvision's setup.py
looks for its optional parts (:func:`vision_part`). How sure each release's table is
(``confidence``, ``note``) is part of the data: no release branch's own ``CMakeLists.txt`` was available, so
every table is "nearest" (see the file's header).

:func:`check_flags` returns ``(field, problem, valid)`` tuples, the shape of :class:`errors.Problem` less
the file name.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal, cast

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from torchkiln.errors import UsageError
from torchkiln.shipped import shipped_toml

Kind = Literal["bool", "string"]

# Spellings accepted for a boolean flag. CMake itself reads more (YES/NO, Y/N, IGNORE, NOTFOUND, any non-zero
# number), but the front ends disagree on them (setup.py's str2bool takes "enabled"; cmake/PreBuildSteps.cmake
# treats only ^(OFF|0|NO|FALSE|N)$ as off), so a recipe keeps to the spellings every reader agrees on.
BOOL_TRUE = frozenset({"1", "ON", "TRUE"})
BOOL_FALSE = frozenset({"0", "OFF", "FALSE"})
BOOL_VALID = "true/false, 1/0, ON/OFF"

_FIELD = "build.flags"
_MINOR_RE = re.compile(r"^(\d+)\.(\d+)")


@dataclass(frozen=True)
class CMakeOption:
    """One build knob of one release, as the data file records it."""

    name: str
    kind: Kind
    declared: str
    default: str
    condition: str
    forced: str
    source: tuple[str, ...]
    note: str


@dataclass(frozen=True)
class Release:
    """One release's table: its options, the names it no longer reads or refuses, and how sure it is."""

    version: str
    confidence: str
    base: str
    frontend: str
    note: str
    options: Mapping[str, CMakeOption]
    removed: Mapping[str, str]  # name -> what to do instead
    refused: Mapping[str, str]  # name -> why the build stops
    conflicts: tuple[tuple[tuple[str, ...], str], ...]


@cache
def data() -> dict[str, Any]:
    """``data/cmake_options.toml`` as parsed."""
    return shipped_toml("cmake_options.toml")


@cache
def host_tools_data() -> dict[str, Any]:
    """``data/host_tools.toml`` as parsed."""
    return shipped_toml("host_tools.toml")


def minor(release: str) -> str:
    """``"2.13"`` for ``"2.13"``, ``"2.13.0"``, ``"2.13.0+cu130"``; the input unchanged when it has no X.Y."""
    match = _MINOR_RE.match(release.strip())
    return f"{match.group(1)}.{match.group(2)}" if match else release


def releases() -> tuple[str, ...]:
    """The torch minor releases the data covers, oldest first."""
    return tuple(data()["releases"])


def _applies(spec: str, release: str) -> bool:
    return Version(release) in SpecifierSet(spec)


def _option(entry: Mapping[str, Any]) -> CMakeOption:
    return CMakeOption(
        name=entry["name"],
        kind=entry["kind"],
        declared=entry["declared"],
        default=entry.get("default", ""),
        condition=entry.get("condition", ""),
        forced=entry.get("forced", ""),
        source=tuple(entry["source"]),
        note=entry.get("note", ""),
    )


@cache
def release(version: str) -> Release:
    """The table of one torch minor release (``"2.13"``; a full version is cut to its minor).

    Raises KeyError for a release the data does not cover. Two entries of one name for one release are a
    data error (ValueError): each release must resolve every name to one option.
    """
    ver = minor(version)
    doc = data()
    if ver not in doc["releases"]:
        raise KeyError(ver)
    options: dict[str, CMakeOption] = {}
    for entry in doc["option"]:
        if _applies(entry["releases"], ver):
            if entry["name"] in options:
                raise ValueError(f"cmake_options.toml: {entry['name']} is listed twice for torch {ver}")
            options[entry["name"]] = _option(entry)
    meta = doc["release"][ver]
    return Release(
        version=ver,
        confidence=meta["confidence"],
        base=meta["base"],
        frontend=meta["frontend"],
        note=meta["note"],
        options=options,
        removed={e["name"]: e["hint"] for e in doc.get("removed", []) if _applies(e["releases"], ver)},
        refused={e["name"]: e["hint"] for e in doc.get("refused", []) if _applies(e["releases"], ver)},
        conflicts=tuple(
            (tuple(e["names"]), e["message"]) for e in doc.get("conflict", []) if _applies(e["releases"], ver)
        ),
    )


def options(version: str) -> Mapping[str, CMakeOption]:
    """Every knob one release reads, by name."""
    return release(version).options


def host_tools(version: str) -> Mapping[str, Any]:
    """Host-tool minimums of one release (cmake_min, ninja_min, git_min, gcc_min, ...; sources beside each).
    A release without a table is refused by name (the rules refuse it earlier; this is the backstop)."""
    tables = host_tools_data()["release"]
    if minor(version) not in tables:
        raise UsageError(
            f"torch {version}: no host-tool minimums for this release (valid: data/host_tools.toml has "
            f"{', '.join(tables)})"
        )
    return cast("Mapping[str, Any]", tables[minor(version)])


def cmake_requirement(version: str) -> str:
    """The pip requirement for a CMake that configures torch ``version``: ``cmake>=3.18,<4`` for 2.6 (its
    third_party declares cmake_minimum_required below 3.5, which CMake 4 refuses; pytorch#150203 first
    shipped in 2.7.0), ``cmake>=3.27`` from 2.9. ``data/host_tools.toml``: ``cmake_min``, ``cmake_below``."""
    tools = host_tools(version)
    below = tools.get("cmake_below")
    return f"cmake>={tools['cmake_min']}" + (f",<{below}" if below else "")


def nvcc_host_compilers(cuda: str) -> Mapping[str, Any]:
    """The newest gcc / clang major (``gcc_max``, ``clang_max``) one CUDA version's nvcc accepts."""
    return cast("Mapping[str, Any]", host_tools_data()["cuda"][minor(cuda)])


def vision_part(name: str) -> Mapping[str, Any]:
    """How torchvision's setup.py finds one optional part (``png``, ``jpeg``, ... of [torchvision.features])
    and what provides it: ``lookup`` and its arguments, ``provides``, ``source``."""
    return cast("Mapping[str, Any]", host_tools_data()["vision_part"][name])


def _releases_with(name: str) -> list[str]:
    return [r for r in releases() if name in release(r).options]


def _span(found: list[str]) -> str:
    """``"2.11-2.15"`` for a contiguous run of supported releases, else the list."""
    all_releases = list(releases())
    first, last = all_releases.index(found[0]), all_releases.index(found[-1])
    if last - first + 1 == len(found) and len(found) > 1:
        return f"{found[0]}-{found[-1]}"
    return ", ".join(found)


def _bool_problem(value: bool | int | str) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if value in (0, 1) else f"{value} is not a boolean"
    if value.strip().upper() in BOOL_TRUE | BOOL_FALSE:
        return None
    return f"{value!r} is not a boolean"


def _as_bool(value: bool | int | str) -> bool:
    if isinstance(value, str):
        return value.strip().upper() in BOOL_TRUE
    return bool(value)


def _unknown(name: str, rel: Release) -> tuple[str, str, str]:
    field = f"{_FIELD}.{name}"
    what = f"not an option of torch {rel.version}'s build"
    if name in rel.removed:
        return (field, what, rel.removed[name])
    elsewhere = _releases_with(name)
    if elsewhere:
        return (field, what, f"{name} exists in torch {_span(elsewhere)}")
    close = difflib.get_close_matches(name, list(rel.options), n=3, cutoff=0.6)
    if close:
        return (field, what, f"did you mean {close[0]}? known: {', '.join(close)}")
    return (field, what, f"one of the {len(rel.options)} names torchkiln/data/cmake_options.toml lists")


def check_flags(version: str, flags: Mapping[str, bool | int | str]) -> list[tuple[str, str, str]]:
    """Every problem with ``flags`` (a recipe's ``[build.flags]``) for torch ``version``.

    Reports names the release does not read (with the closest known name, or the releases that do have
    it), names the release refuses, values of the wrong type, and pairs the build refuses together. An
    empty list means every flag is one the release reads, with a value of the right type.
    """
    ver = minor(version)
    try:
        Version(ver)
        rel = release(ver)
    except (KeyError, InvalidVersion):
        return [(_FIELD, f"no CMake option table for torch {ver}", ", ".join(releases()))]
    problems: list[tuple[str, str, str]] = []
    for name, value in flags.items():
        field = f"{_FIELD}.{name}"
        if name in rel.refused:
            problems.append((field, f"torch {rel.version}'s build refuses {name}", rel.refused[name]))
            continue
        option = rel.options.get(name)
        if option is None:
            problems.append(_unknown(name, rel))
        elif option.kind == "bool":
            problem = _bool_problem(value)
            if problem:
                problems.append((field, problem, BOOL_VALID))
        elif isinstance(value, bool):
            hint = f"a string ({option.note})" if option.note else "a string"
            problems.append((field, f"{str(value).lower()} is not a string", hint))
    for names, message in rel.conflicts:
        present = [n for n in names if n in flags and not _bool_problem(flags[n]) and _as_bool(flags[n])]
        if len(present) == len(names):
            problems.append((f"{_FIELD}.{names[-1]}", message, f"set {' or '.join(names)} to false"))
    return problems
