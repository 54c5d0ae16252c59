"""One comparison of a build (:class:`Comparison`), the helpers every build-config check makes one with, and
:func:`flag`, a build-settings boolean read.

Apart from :mod:`.buildconfig` so that the checks of each library (the ``buildconfig_*`` modules),
:mod:`.provenance` and :mod:`.attestation` share them without importing one another. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

from torchkiln.recipe.spelling import truth


def flag(value: str | None) -> bool | None:
    """Normalise a build-settings boolean (``ON``/``1``/``True``/``OFF``/``0``...); None when absent."""
    if value is None:
        return None
    found = truth(value)
    if found is None:
        raise ValueError(f"{value!r} is not a boolean build setting (ON/OFF/1/0/TRUE/FALSE)")
    return found


@dataclass(frozen=True)
class Comparison:
    """One comparison. ``status`` is "pass", "fail" or "skip"; ``message`` says why. ``field`` is the
    recipe field a recipe check compares with (empty for checks of the build against itself), and
    leads every failure message, so a mismatch names what to look at in the recipe."""

    id: str
    status: str
    message: str
    expected: Any = None
    actual: Any = None
    field: str = ""


def _cmp(
    check_id: str, what: str, expected: Any, actual: Any, ok: bool | None = None, *, field: str = ""
) -> Comparison:
    ok = (expected == actual) if ok is None else ok
    prefix = f"{field}: " if field else ""
    if ok:
        return Comparison(check_id, "pass", f"{prefix}{what}: {actual}", expected, actual, field)
    return Comparison(
        check_id, "fail", f"{prefix}{what}: expected {expected}, actual {actual}", expected, actual, field
    )


def _skip(check_id: str, reason: str, *, field: str = "") -> Comparison:
    return Comparison(check_id, "skip", reason, field=field)


def _release(version: Version, parts: int) -> tuple[int, ...]:
    return tuple((version.release + (0,) * parts)[:parts])


def _version_or_none(text: str | None) -> Version | None:
    if text is None:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None
