"""tests/conftest.py's fixture directories (kit/fixturetmp.py): what a fixture makes with tmp_path_factory is
removed at its teardown, kept after a failure or while something is mounted there; a fixture set up inside
another's setup keeps its own. Run as a pytest of its own laid out as this suite is (a copy of
tests/conftest.py in a directory below the rootdir: its hooks see what they see here, no more)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from kit import ROOT

SUITE = textwrap.dedent(
    """
    import os, subprocess
    from pathlib import Path
    import pytest

    @pytest.fixture(scope="session")
    def session_dir(tmp_path_factory):
        return tmp_path_factory.mktemp("session-made")

    @pytest.fixture(scope="module")
    def module_dir(request, tmp_path_factory):
        request.getfixturevalue("session_dir")  # set up inside this setup: still the session's
        made = tmp_path_factory.mktemp("module-made")
        (made / "tree").mkdir()
        return made

    @pytest.fixture
    def mounted(tmp_path_factory):
        made = tmp_path_factory.mktemp("mounted")
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(made)], check=True)
        (made / "inside").write_text("on the mount")
        return made  # left mounted: never removed through it
    """
)
FIRST = "def test_first(module_dir):\n    assert module_dir.is_dir()\n"
LATER = textwrap.dedent(
    """
    def test_later(tmp_path_factory):
        base = tmp_path_factory.getbasetemp()
        assert (base / "session-made0").is_dir()  # test_a's session fixture: set up inside a module's setup
        assert {p.name for p in base.glob("module-made[0-9]*")} == set(EXPECTED), sorted(base.iterdir())
    """
)


def run(tmp_path: Path, first: str, expected: list[str], extra: str = "") -> subprocess.CompletedProcess[str]:
    """A suite laid out as this one is: its tests and a copy of tests/conftest.py in ``tests/`` below the
    rootdir, so that the session's fixtures belong to a node above the conftest's directory, as here."""
    tests = tmp_path / "suite" / "tests"
    tests.mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "conftest.py", tests / "conftest.py")
    (tests / "test_a.py").write_text(SUITE + first + extra)
    (tests / "test_b.py").write_text(f"EXPECTED = {expected!r}\n" + LATER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT / "src")])}
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--basetemp={tmp_path / 'base'}"]
    return subprocess.run(
        [*argv, "--rootdir", str(tests.parent), "-c", os.devnull, "tests"],
        capture_output=True, text=True, env=env, check=False, cwd=tests.parent,
    )  # fmt: skip


def test_a_module_fixtures_directory_is_gone_when_the_module_ends(tmp_path: Path) -> None:
    done = run(tmp_path, FIRST, [])
    assert done.returncode == 0, done.stdout[-3000:]
    assert "2 passed" in done.stdout


def test_a_failure_keeps_what_its_fixtures_made(tmp_path: Path) -> None:
    failing = FIRST.replace(
        "def test_first", "def test_other(module_dir):\n    assert False\n\n\ndef test_first"
    )
    done = run(tmp_path, failing, ["module-made0"])
    assert done.returncode == 1 and "1 failed, 2 passed" in done.stdout, done.stdout[-3000:]
    assert (tmp_path / "base" / "module-made0" / "tree").is_dir()


def test_nothing_is_removed_through_a_mount(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        assert subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(tmp_path)], check=False).returncode != 0
        return  # (no mount is made without root: the case cannot arise)
    mounted = "\n\ndef test_mounted(mounted):\n    assert (mounted / 'inside').is_file()\n"
    done = run(tmp_path, FIRST, [], mounted)
    try:
        assert done.returncode == 0, done.stdout[-3000:]
        assert (tmp_path / "base" / "mounted0" / "inside").read_text() == "on the mount"
    finally:
        subprocess.run(["umount", str(tmp_path / "base" / "mounted0")], check=False)
