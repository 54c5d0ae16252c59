"""A fixture's own temporary directories, removed when the fixture is torn down (CI's disk).

pytest removes a passing test's ``tmp_path`` when the test ends (``tmp_path_retention_policy = "failed"``),
but what a fixture makes with ``tmp_path_factory.mktemp`` stays until the whole session ends: a module's
build trees, clusters, venvs and wheelhouses, gigabytes by the end of the tests session, and CI ran out of
disk on a machine with less free space than usual. Here the directories a fixture's setup made directly under
the session's base temporary directory are that fixture's, and are removed when it is torn down, unless a
test failed meanwhile (kept to look at, as pytest keeps a failed test's ``tmp_path``) or something is still
mounted under one (never removed through a mount).

This module is a pytest plugin that tests/conftest.py registers (``pytest_configure``): registered, its hooks
see every fixture, where a conftest's own hooks see only the nodes below its directory, not the session's
fixtures (a session fixture first set up inside another fixture's setup, ``getfixturevalue``, had its
directory taken as the other's, and removed with it). What a test makes there itself (a factory fixture's,
``make_cluster()``) stays to the session's end.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

# per fixture being set up, innermost last: the directories its nested setups (getfixturevalue) claimed
_claimed: list[set[str]] = []
# id(FixtureDef) -> (its directories, the failures counted when it was set up)
_owned: dict[int, tuple[list[Path], int]] = {}


@contextmanager
def setting_up(fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest) -> Iterator[None]:
    """Record the directories ``fixturedef``'s setup makes under the base temporary directory."""
    factory: pytest.TempPathFactory | None = getattr(request.config, "_tmp_path_factory", None)
    if factory is None or fixturedef.argname in {"tmp_path_factory", "tmpdir_factory"}:
        yield
        return
    base = factory.getbasetemp()
    before = set(os.listdir(base))
    _claimed.append(set())
    try:
        yield
    finally:
        nested = _claimed.pop()
        made = set(os.listdir(base)) - before - nested
        if _claimed:
            _claimed[-1] |= made | nested
        if made:
            _owned[id(fixturedef)] = ([base / name for name in sorted(made)], request.session.testsfailed)


def torn_down(fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest) -> None:
    """Remove what ``fixturedef``'s setup made, once no test failed since and nothing is mounted there."""
    made, failures = _owned.pop(id(fixturedef), ([], 0))
    if made and request.session.testsfailed == failures:
        _remove(made)


def _remove(made: list[Path]) -> None:
    mounted = _mount_points()
    for path in made:
        if path.is_symlink():  # mktemp's "<prefix>current", to the newest of its numbered directories
            path.unlink(missing_ok=True)
        elif not any(point == path or path in point.parents for point in mounted):
            shutil.rmtree(path, ignore_errors=True)


def _mount_points() -> list[Path]:
    """Where something is mounted (/proc/self/mountinfo's fifth field, octal escapes decoded)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    return [Path(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split(" ")[4])) for line in lines]


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest) -> object:
    with setting_up(fixturedef, request):
        return (yield)


def pytest_fixture_post_finalizer(
    fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest
) -> None:
    torn_down(fixturedef, request)
