"""The walk every tree digest and snapshot rests on (torchkiln.files.digests.tree_entries): the entries of a
source tree, checked against find(1) over generated trees. A tree is walked several times a build, so the walk
keeps paths as strings; what it lists must not change with that: files, symlinks (to a directory too, never
followed), FIFOs, ``.git`` directories (or links to one) left out but a ``.git`` file kept, skipped directories
left out wherever they lie, excluded entries left out, sorted by relative path."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from torchkiln.build.fingerprint import tree_snapshot
from torchkiln.files.digests import tree_entries, tree_files
from torchkiln.source.exact import entry_stat, stats, tree_paths

NAMES = st.sampled_from(["a", "b", "sub", ".git", "build", "x y", "ü", "-n", ".hidden", "a.b"])
KINDS = st.sampled_from(["file", "dir", "link-file", "link-dir", "link-dangling", "fifo", "exec"])
# a tree: a list of (path of names, kind); a later entry under a path that is not a directory is dropped
TREES = st.lists(st.tuples(st.lists(NAMES, min_size=1, max_size=3), KINDS), max_size=14)


def make(top: Path, tree: list[tuple[list[str], str]]) -> None:
    for names, kind in tree:
        path = top.joinpath(*names)
        above = [top.joinpath(*names[:i]) for i in range(1, len(names))]
        if any(os.path.lexists(p) and (p.is_symlink() or not p.is_dir()) for p in above) or os.path.lexists(
            path
        ):
            continue  # under something that is not a directory, or made already
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "dir":
            path.mkdir()
            (path / "inside").write_text("x")
        elif kind in ("file", "exec"):
            path.write_text(kind)
            path.chmod(0o755 if kind == "exec" else 0o644)
        elif kind == "link-file":
            path.symlink_to("/etc/hostname")
        elif kind == "link-dir":
            path.symlink_to(top if len(names) > 1 else "/usr")
        elif kind == "link-dangling":
            path.symlink_to("nowhere")
        else:
            os.mkfifo(path)


def found_by_find(top: Path, skip: list[Path], exclude: set[str]) -> list[str]:
    """What find(1) lists: every entry that is no directory, a ``.git`` directory (or a link to one) and
    ``skip`` pruned."""
    argv = [
        "find",
        str(top),
        "-mindepth",
        "1",
        "(",
        "-name",
        ".git",
        "(",
        "-type",
        "d",
        "-o",
        "-xtype",
        "d",
        ")",
    ]
    for directory in skip:
        argv += ["-o", "-path", str(directory)]
    argv += [")", "-prune", "-o", "!", "-type", "d", "-print0"]
    out = subprocess.run(argv, capture_output=True, check=True).stdout.decode("utf-8", "surrogateescape")
    relative = [p[len(str(top)) + 1 :] for p in out.split("\0") if p]
    return sorted(r for r in relative if r not in exclude)


@settings(max_examples=120, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(tree=TREES, skip_build=st.booleans(), exclude_a=st.booleans())
@example(tree=[(["sub", ".git"], "file"), ([".git"], "dir")], skip_build=False, exclude_a=False)
@example(tree=[([".git"], "link-dir"), (["build", "a"], "file")], skip_build=True, exclude_a=True)
@example(tree=[(["sub"], "link-dir"), (["sub2"], "fifo")], skip_build=False, exclude_a=False)
def test_the_walk_lists_what_find_lists(
    tmp_path_factory: pytest.TempPathFactory, tree, skip_build: bool, exclude_a: bool
) -> None:
    top = tmp_path_factory.mktemp("tree")
    make(top, tree)
    skip = [top / "build", top / "sub" / "build"] if skip_build else []
    exclude = {"a", "sub/a"} if exclude_a else set()
    expected = found_by_find(top, [s for s in skip if s.is_dir() and not s.is_symlink()], exclude)
    entries = tree_entries(top, exclude, skip)
    assert [r for r, _ in entries] == expected
    assert all(full == os.path.join(top, r) for r, full in entries)
    assert [(r, str(p)) for r, p in tree_files(top, exclude, skip)] == entries
    assert tree_paths(top, skip=skip) == [r for r, _ in tree_entries(top, skip=skip)]
    assert stats(top, expected) == {r: entry_stat(top / r) for r in expected}
    snapshot = tree_snapshot(top, skip)
    assert set(snapshot) == {r for r, _ in tree_entries(top, skip=skip)}
    assert all(snapshot[r] == (os.lstat(top / r).st_size, os.lstat(top / r).st_mtime_ns) for r in snapshot)


@pytest.mark.parametrize("spelling", ["{top}", "{top}/", "{top}/./", "{top}/sub/.."])
def test_the_top_may_be_spelled_any_way_that_names_it(tmp_path: Path, spelling: str) -> None:
    make(tmp_path, [(["a"], "file"), (["sub", "b"], "file")])
    top = Path(spelling.format(top=tmp_path))
    assert [r for r, _ in tree_entries(top)] == ["a", "sub/b"]
