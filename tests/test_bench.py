"""The rebuild benchmark runs (issue 38 item 5): CI runs bench/rebuild.py in its quick form, so a change that
breaks the benchmark fails CI instead of going unnoticed until someone measures. Nothing here is timed: the
benchmark measures; this checks that it ran every row to the end and reports what it says it reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from kit import ROOT
from kit.imagekit import need

pytestmark = pytest.mark.integration

COLUMNS = ("seconds", "compile_s", "around_compile_s", "unaccounted_s", "ratio_to_floor", "load")


def test_the_rebuild_benchmark_runs_in_its_quick_form(tmp_path: Path) -> None:
    for tool in ("ccache", "ninja", "python3.11"):
        need(tool)
    results = tmp_path / "rebuild.json"
    argv = [sys.executable, str(ROOT / "bench" / "rebuild.py"), "--quick", "--scratch", str(tmp_path)]
    done = subprocess.run(
        [*argv, "--results", str(results)], capture_output=True, text=True, check=False, timeout=1800
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    data = json.loads(results.read_text())
    rows = {row["name"]: row for row in data["rows"]}
    cold, noop = rows["torchkiln cold"], rows["torchkiln no-op"]
    by_hand = next(row for name, row in rows.items() if name.startswith("by hand"))
    for row in (cold, noop, by_hand):
        assert all(column in row for column in COLUMNS), row
    assert set(cold["ran"]) == set(cold["steps"]) and "torchvision:wheel" in cold["ran"]
    assert noop["ran"] == [] and noop["reused"] == [], "the rerun is a no-op"
    assert noop["wheel_sha256"] == cold["wheel_sha256"]
    # the command's own time outside the steps is said (the plan, --torch resolved there; the host checks;
    # publishing), so what no field says is start-up, imports and the signature only
    for row in (cold, noop):
        assert set(row["outside_steps_s"]) == {"plan", "preflight", "publish"}, row
        assert row["outside_steps_s"]["plan"] > 0 and row["unaccounted_s"] < row["seconds"]
    assert cold["stats"]["misses"] == 4 and by_hand["stats"]["misses"] == 4, "every unit of the tree compiled"
    # the edit loop's code edit (issue 47): one unit changed, rebuilt in place by both; torchkiln's wheel is
    # the edited source's (not the cold build's) and a fresh build of that state gives the same bytes
    edited = rows["torchkiln in place: a code change in one .cpp (csrc/ops/op_00.cpp)"]
    hand_edited = rows["by hand in place: a code change in one .cpp (csrc/ops/op_00.cpp)"]
    assert edited["ran"] == ["torchvision:wheel"] and edited["stats"]["misses"] == 1, edited
    assert hand_edited["stats"]["misses"] == 1, "by hand rebuilt the one unit in place"
    assert edited["same_wheel_as_fresh"] and edited["wheel_sha256"] == edited["fresh_wheel_sha256"]
    assert edited["wheel_sha256"] != cold["wheel_sha256"], "the edit is a code change"
    assert edited["ratio_to_by_hand"] == round(edited["seconds"] / hand_edited["seconds"], 2)
    # a cached row's ratio is over the by-hand builds run beside its samples (one in the quick form)
    warm = rows["torchkiln warm local, fresh workdir, same path"]
    assert "torchvision:wheel" in warm["ran"] and warm["wheel_sha256"] == cold["wheel_sha256"], warm
    assert warm["ratio_to_paired_by_hand"] == round(warm["seconds"] / warm["paired_by_hand_s"][0], 2)
    assert "x paired by hand" in done.stdout
    # a fresh work directory's venvs come from the store (issue 47): their restore, the entry checked and
    # linked, is said per row
    first = rows["torchkiln edit loop: the first build of its tree"]
    assert "torchvision:install-torch" in first["reused"] and first["restore_s"] >= 0, first
    assert all("restore_s" in row for name, row in rows.items() if name.startswith("torchkiln"))
    assert (
        "unaccounted (s)" in done.stdout and "restore (s)" in done.stdout and "torchkiln no-op" in done.stdout
    ), "the table"
    assert "x by hand in place" in done.stdout and "= fresh" in done.stdout
    assert not any(tmp_path.glob("kiln-rebuild-*")), "the scratch trees are removed"
