"""A venv checked against its own RECORDs (issue 47, torchkiln.build.venvcheck).

Real venvs (``python -m venv --without-pip``), real pip installing tiny wheels into them (the RECORDs as pip
writes them: quoted paths, scripts under ``bin/`` whose ``#!`` line pip writes, bytecode listed without a
digest), real damage done to a copy: each kind of damage from the table below is found and names the file,
each harmless change is not. The answer kept by the files' identities is read back: a clone with hard links
is not hashed again, and after a change only the changed file is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kit.dists import tiny_wheel
from kit.imagekit import examples

from torchkiln.build import venvcheck
from torchkiln.build.envstore import clone_tree, link_venv
from torchkiln.plan.records import Records

OFFLINE = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1"}
SITE = "lib/python{}.{}/site-packages".format(*sys.version_info[:2])


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with distributions of every shape pip installs: a module, a package with a subpackage and
    binary data, file names RECORD must quote (a comma, a space, a quote), a script under bin/, a .pth."""
    root = tmp_path_factory.mktemp("venvcheck")
    wheels = root / "wheels"
    wheels.mkdir()
    made = [
        tiny_wheel(wheels, "amodule", "1.0"),
        tiny_wheel(
            wheels,
            "apackage",
            "2.0",
            module=False,
            files={
                "apackage/__init__.py": "X = 1\n",
                "apackage/sub/__init__.py": "Y = 2\n",
                "apackage/sub/table.bin": bytes(range(256)) * 64,
                "apackage/odd, name.txt": "a comma and a space\n",
                'apackage/quote"d.txt': "a quote\n",
            },
        ),
        tiny_wheel(
            wheels, "ascript", "1.0", files={"ascript-1.0.data/scripts/ascript-tool": "#!python\nprint(1)\n"}
        ),
        tiny_wheel(wheels, "apth", "1.0", files={"apth.pth": "import os\n"}),
    ]
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip = [
        sys.executable,
        "-m",
        "pip",
        "--python",
        str(venv / "bin" / "python"),
        "install",
        "-q",
        "--no-deps",
    ]
    subprocess.run([*pip, *map(str, made)], check=True, env=OFFLINE)
    return venv


def copy_of(venv: Path, where: Path) -> Path:
    """A real copy (its own inodes: damage done in place stays in it)."""
    target = where / "venv"
    shutil.copytree(venv, target, symlinks=True)
    return target


def records(where: Path) -> Records:
    return Records([where / "records"])


Damage = Callable[[Path], None]


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _append(path: Path) -> None:
    with path.open("ab") as handle:
        handle.write(b"#")


def _same_size(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[0] ^= 0x01
    with path.open("r+b") as handle:  # in place, as an editor that keeps the inode writes it
        handle.write(data)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000_000))


def _replaced(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.unlink()
    path.write_bytes(bytes(data))  # a new file of the same size (the way an editor saving by rename does)


def _copied_over(path: Path) -> None:
    shutil.copy2(path, path.with_name(path.name + ".tmp"))
    os.replace(path.with_name(path.name + ".tmp"), path)


# Each kind of damage, and where it happens (a file in site-packages RECORD lists with a digest; a script)
DAMAGES: dict[str, Damage] = {
    "removed": lambda p: p.unlink(),
    "truncated": _truncate,
    "appended to": _append,
    "edited in place, same size": _same_size,
    "replaced by another of the same size": _replaced,
}
# What changes a file without changing what it holds: never damage
HARMLESS: dict[str, Damage] = {
    "touched": lambda p: os.utime(p, ns=(0, 1_000_000_000)),
    "chmod": lambda p: p.chmod(0o600),
    "copied over itself (a new inode)": _copied_over,
}
FILES = (
    "amodule.py",
    "apackage/__init__.py",
    "apackage/sub/table.bin",
    "apackage/odd, name.txt",
    'apackage/quote"d.txt',
    "apth.pth",
    "apackage-2.0.dist-info/METADATA",
)


@given(kind=st.sampled_from(sorted(DAMAGES)), name=st.sampled_from(FILES))
@example(kind="removed", name="apackage/sub/table.bin")
@example(kind="edited in place, same size", name="apackage/odd, name.txt")
@settings(
    max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_each_kind_of_damage_to_a_listed_file_is_found_and_named(
    installed: Path, tmp_path_factory: pytest.TempPathFactory, kind: str, name: str
) -> None:
    where = tmp_path_factory.mktemp("damage")
    venv = copy_of(installed, where)
    assert venvcheck.damage(venv, records(where)) is None, "sound as pip left it"
    DAMAGES[kind](venv / SITE / name)
    found = venvcheck.damage(venv, records(where))
    assert found is not None and f"{SITE}/{name} (" in found.problems[0], (kind, found)
    assert found.line().startswith(f"{venv} is damaged: {SITE}/{name} ")


@given(kind=st.sampled_from(sorted(HARMLESS)), name=st.sampled_from(FILES))
@settings(
    max_examples=examples(10), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_a_change_that_keeps_what_a_file_holds_is_not_damage(
    installed: Path, tmp_path_factory: pytest.TempPathFactory, kind: str, name: str
) -> None:
    where = tmp_path_factory.mktemp("harmless")
    venv = copy_of(installed, where)
    assert venvcheck.damage(venv, records(where)) is None
    HARMLESS[kind](venv / SITE / name)
    assert venvcheck.damage(venv, records(where)) is None


def test_scripts_outside_site_packages_must_be_there_whatever_their_first_line(
    installed: Path, tmp_path: Path
) -> None:
    """A clone rewrites a script's ``#!`` line for its own path (its digest is not RECORD's any more): only
    that the script is there is checked."""
    venv = copy_of(installed, tmp_path)
    script = venv / "bin" / "ascript-tool"
    script.write_text("#!/elsewhere/bin/python\nprint(1)\n")
    assert venvcheck.damage(venv, records(tmp_path)) is None
    script.unlink()
    found = venvcheck.damage(venv, records(tmp_path))
    assert found is not None and found.problems == ("bin/ascript-tool (ascript-1.0) is missing",)


def test_what_no_record_lists_is_not_checked_and_a_missing_record_is_damage(
    installed: Path, tmp_path: Path
) -> None:
    venv = copy_of(installed, tmp_path)
    for pyc in (venv / SITE).rglob("*.pyc"):
        pyc.unlink()  # bytecode: RECORD lists it without a digest
    (venv / SITE / "apackage" / "new.txt").write_text("written after the install\n")
    assert venvcheck.damage(venv, records(tmp_path)) is None
    (venv / SITE / "amodule-1.0.dist-info" / "RECORD").unlink()
    found = venvcheck.damage(venv, records(tmp_path))
    assert found is not None and "amodule-1.0.dist-info/RECORD is missing" in found.problems[0]


def test_a_linked_venv_whose_entry_is_gone_is_damaged(installed: Path, tmp_path: Path) -> None:
    """A venv linked to a store entry (build.envstore.link_venv) after the store was removed: its
    site-packages' links lead nowhere, and no RECORD can be read."""
    entry = copy_of(installed, tmp_path / "store")
    venv = tmp_path / "work" / "venv"
    link_venv(entry, venv, str(installed))
    assert venvcheck.damage(venv, records(tmp_path)) is None
    shutil.rmtree(entry)
    found = venvcheck.damage(venv, records(tmp_path))
    assert found is not None and all("RECORD is missing" in p for p in found.problems), found


def test_the_answer_is_kept_by_identity_and_only_a_changed_file_is_hashed(
    installed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first check hashes every listed file; a clone with hard links (a store entry and the work
    directory's venv, or a linked venv) reads that answer and hashes none; after one file is replaced by an
    identical copy, that file alone is hashed. ``trust``: a step's own writes are taken as they are."""
    hashed: list[str] = []
    digest = venvcheck._digest

    def counting(path: str, recorded: str) -> str | None:
        hashed.append(path)
        return digest(path, recorded)

    monkeypatch.setattr(venvcheck, "_digest", counting)
    venv = copy_of(installed, tmp_path / "a")
    kept = records(tmp_path)
    assert venvcheck.damage(venv, kept) is None
    listed = len(hashed)
    assert listed >= len(FILES)
    clone = tmp_path / "b" / "venv"
    clone_tree(venv, clone)
    hashed.clear()
    assert venvcheck.damage(clone, kept) is None and hashed == [], "a hard-link clone is the same files"
    table = clone / SITE / "apackage" / "sub" / "table.bin"
    HARMLESS["copied over itself (a new inode)"](table)
    assert venvcheck.damage(clone, kept) is None and hashed == [str(table)]
    hashed.clear()
    other = copy_of(installed, tmp_path / "c")  # a copy: every file a new identity
    assert venvcheck.damage(other, kept, trust=True) is None and hashed == []
    assert venvcheck.damage(other, kept) is None and hashed == [], "read back as the trusted answer"


def test_the_identities_looked_up_by_directory_are_the_identities_of_the_paths(tmp_path: Path) -> None:
    """The answer's fast path opens each directory once: for every kind of path it must say what a lookup by
    the whole path says (a missing file or directory: None; a link: what it leads to)."""
    base = tmp_path / "venv"
    (base / SITE / "pkg" / "sub").mkdir(parents=True)
    for name in ("pkg/__init__.py", "pkg/sub/data, with comma.bin", "top.py", "pkg/sub/'quoted' name.py"):
        (base / SITE / name).write_text(name)
    (base / "at-root.txt").write_text("root")
    (base / SITE / "pkg" / "link.py").symlink_to("__init__.py")
    (base / SITE / "pkg" / "dangling.py").symlink_to("gone.py")
    (base / SITE / "linked-dir").symlink_to("pkg")
    paths = [
        f"{SITE}/pkg/__init__.py",
        f"{SITE}/pkg/sub/data, with comma.bin",
        f"{SITE}/top.py",
        "at-root.txt",
        f"{SITE}/pkg/link.py",
        f"{SITE}/pkg/dangling.py",
        f"{SITE}/linked-dir/__init__.py",
        f"{SITE}/pkg/missing.py",
        f"{SITE}/no-such-dir/file.py",
        f"{SITE}/pkg/sub/'quoted' name.py",
        f"{SITE}/pkg/__init__.py",  # listed twice (two RECORDs)
    ]
    prefix = str(base) + os.sep
    expected = [venvcheck._identity(prefix + p) for p in paths]
    assert venvcheck._identities(prefix, paths) == expected
    assert expected.count(None) == 3  # dangling, missing, in a missing directory
