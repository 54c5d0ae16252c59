"""The environment store (issue 15): venvs kept by their content and cloned into other work directories.

Real venvs (``python -m venv --without-pip``, a fraction of a second), real hard links, and the real step loop
on plans whose env steps are small commands that change the venv (a marker file, a console script whose
``#!`` line names the venv's python) and count their runs in a file outside every work directory. The store
must spare a second work directory those runs, give it a venv that works at its own path (the first work
directory is deleted before the second build, so a script still naming it would fail), and never change what
it keeps.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from kit import ROOT
from kit.dists import tiny_wheel
from rich.console import Console

from torchkiln.artifacts.manifest import load_manifest
from torchkiln.build.envstore import EnvStore, clone_tree, default_env_store, linked_origin, relocate_venv
from torchkiln.build.loop import BuildOptions, BuildResult, run_build
from torchkiln.cache import resolve_cache
from torchkiln.commands.plan import env_store_from_args
from torchkiln.errors import UsageError
from torchkiln.files import shared
from torchkiln.plan.make import make_plan
from torchkiln.plan.model import Plan, Step
from torchkiln.recipe.loader import load_recipe

RECIPE = ROOT / "tests" / "data" / "ext-cpu-test.toml"

# Each env step appends its name to the run log given as argv[1] (outside every work directory).
COUNT = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n'); "
SCRIPT = (
    "import os, sys; venv = sys.argv[3]; path = os.path.join(venv, 'bin', 'tool'); "
    "open(path, 'w').write('#!' + os.path.join(venv, 'bin', 'python') + '\\nprint(\"tool ok\")\\n'); "
    "os.chmod(path, 0o755)"
)


def make_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path


def builder_plan(root: Path, store: Path | None, runs: Path, requirement: str = "numpy==2.3.0\n") -> Plan:
    """A builder at ``root``: its source tree (with a requirement file) and work directory; env steps that
    make the venv, install "requirements" (a marker in the venv, the constraints file beside it) and a
    console script; a compile that runs that script and copies a wheel; publish."""
    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "setup.py").write_text("# stands in for torch\n")
    (src / "version.txt").write_text("2.13.0a0\n")  # the release the label names (torchkiln.source.version)
    (src / "requirements.txt").write_text(requirement)
    made = root / "made"
    made.mkdir(exist_ok=True)
    wheel = tiny_wheel(made, "torch", "2.13.0+cpu")
    plan = make_plan(
        load_recipe(RECIPE),
        workdir=root / "work",
        dist=root / "dist",
        source_dirs={"torch": src},
        only="torch",
        cache=resolve_cache(None, kind="none"),
        jobs=1,
        env_store=store,
    )
    venv, python = plan.paths.venv, str(plan.paths.venv_python)
    constraints = plan.paths.constraints
    wheelhouse = plan.paths.wheelhouse / "torch"
    count = (str(runs),)
    steps = [
        Step(
            "build-env:venv",
            "env",
            "",
            (
                sys.executable,
                "-c",
                COUNT + "import venv; venv.create(sys.argv[3])",
                *count,
                "venv",
                str(venv),
            ),
            creates=python,
            venv=str(venv),
        ),
        Step(
            "build-env:deps",
            "env",
            "",
            (
                python,
                "-c",
                COUNT
                + "import shutil; shutil.copy(sys.argv[3], sys.argv[4]); shutil.copy(sys.argv[3], sys.argv[5])",
                *count,
                "deps",
                str(src / "requirements.txt"),
                str(venv / "marker.txt"),
                str(constraints),
            ),
            reads=(str(src / "requirements.txt"),),
            creates=str(constraints),
            venv=str(venv),
        ),
        Step(
            "build-env:script",
            "env",
            "",
            (python, "-c", COUNT + SCRIPT, *count, "script", str(venv)),
            venv=str(venv),
        ),
        Step(
            "torch:wheel",
            "compile",
            "torch",
            (
                python,
                "-c",
                "import shutil, subprocess, sys; "
                "assert subprocess.run([sys.argv[1]], capture_output=True, text=True).stdout == 'tool ok\\n'; "
                "shutil.copy(sys.argv[2], sys.argv[3])",
                str(venv / "bin" / "tool"),
                str(wheel),
                str(wheelhouse),
            ),
            wheels=str(wheelhouse),
        ),
        next(s for s in plan.steps if s.kind == "publish"),
    ]
    return replace(plan, steps=steps)


def build(plan: Plan) -> tuple[BuildResult, str]:
    out = io.StringIO()
    # the steps count their runs in a file outside every work directory, which a build step's sandbox hides
    options = BuildOptions(console=Console(file=out, width=200), skip_postcheck=True, isolation=False)
    result = run_build(plan, options)
    return result, out.getvalue()


def statuses(result: BuildResult) -> dict[str, str]:
    return {s.name: s.status for s in result.steps}


def runs_of(runs: Path) -> list[str]:
    return runs.read_text().split() if runs.exists() else []


def entries(store: Path) -> list[Path]:
    return sorted(p for p in store.iterdir() if not p.name.startswith("."))


def test_a_second_work_directory_reuses_the_venv_without_running_its_steps(tmp_path: Path) -> None:
    store, runs = tmp_path / "store", tmp_path / "runs.txt"
    first, _ = build(builder_plan(tmp_path / "a", store, runs))
    assert first.ran == ["build-env:venv", "build-env:deps", "build-env:script", "torch:wheel", "publish"]
    assert runs_of(runs) == ["venv", "deps", "script"]
    assert len(entries(store)) == 3, "one entry per step that changed the venv"
    own = linked_origin(tmp_path / "a" / "work" / "venv")
    assert own is None, "cloned into the store: later steps use it (only the check's venv is moved there)"
    kept = entries(store)
    subprocess.run(["rm", "-rf", str(tmp_path / "a")], check=True)  # a script naming A's venv would now fail

    plan = builder_plan(tmp_path / "elsewhere" / "b", store, runs)
    second, out = build(plan)
    assert statuses(second) == {
        "build-env:venv": "reused",
        "build-env:deps": "reused",
        "build-env:script": "reused",
        "torch:wheel": "ran",
        "publish": "ran",
    }
    assert runs_of(runs) == ["venv", "deps", "script"], "no env step ran again"
    assert out.count("reused from the environment store") == 3
    venv = plan.paths.venv
    assert (venv / "bin" / "tool").read_text().startswith(f"#!{venv}/bin/python\n"), "relocated to B's venv"
    assert plan.paths.constraints.read_text() == "numpy==2.3.0\n", "what the step left outside the venv"
    metas = {e: json.loads((e / "meta.json").read_text()) for e in kept}
    assert {m["venv"] for m in metas.values()} == {str(tmp_path / "a" / "work" / "venv")}
    by_step = {m["step"]: e for e, m in metas.items()}
    stored = by_step["build-env:script"] / "venv"
    assert (
        (stored / "bin" / "tool").read_text().startswith(f"#!{tmp_path / 'a' / 'work' / 'venv'}/bin/python")
    )
    assert os.stat(venv / "marker.txt").st_ino == os.stat(stored / "marker.txt").st_ino, "hard links, no copy"
    steps = {s.name: s for s in load_manifest(second.manifest).steps}
    assert steps["build-env:deps"].status == "reused"

    again, _ = build(plan)
    assert again.ran == [] and {s.status for s in again.steps} <= {"skipped"}, "a no-op stays a no-op"


def test_a_changed_requirement_runs_from_the_step_that_reads_it(tmp_path: Path) -> None:
    store, runs = tmp_path / "store", tmp_path / "runs.txt"
    build(builder_plan(tmp_path / "a", store, runs))
    second, _ = build(builder_plan(tmp_path / "b", store, runs, requirement="numpy==2.3.1\n"))
    assert statuses(second)["build-env:venv"] == "reused"
    assert second.ran[:2] == ["build-env:deps", "build-env:script"], "the venv after a changed step is new"
    assert runs_of(runs)[3:] == ["deps", "script"]
    assert (tmp_path / "b" / "work" / "venv" / "marker.txt").read_text() == "numpy==2.3.1\n"


def test_a_vanished_venv_runs_every_step_on_it_again(tmp_path: Path) -> None:
    """Without a store: the venv step makes a bare venv again, so the steps that filled it must run too
    (before, they were skipped as unchanged and the build ran in an empty venv)."""
    runs = tmp_path / "runs.txt"
    plan = builder_plan(tmp_path / "a", None, runs)
    build(plan)
    subprocess.run(["rm", "-rf", str(plan.paths.venv)], check=True)
    again, _ = build(plan)
    assert again.ran[:3] == ["build-env:venv", "build-env:deps", "build-env:script"]
    assert runs_of(runs) == ["venv", "deps", "script"] * 2


def test_only_a_venv_made_in_this_run_is_kept(tmp_path: Path) -> None:
    """A step that runs again on a venv an earlier run made is not kept (that venv may hold what no key says:
    the store keeps only what this run made from nothing, issue 27). A work directory whose venv is made in
    the run (here: cloned from the store) keeps the steps after it; a step that runs where later steps ran
    before is never kept (its venv would hold more than its key says)."""
    store, runs = tmp_path / "store", tmp_path / "runs.txt"
    build(builder_plan(tmp_path / "a", store, runs))
    assert len(entries(store)) == 3
    build(builder_plan(tmp_path / "a", store, runs, requirement="numpy==2.3.1\n"))
    assert len(entries(store)) == 3, "the venv was made by the run before: nothing kept"
    second, _ = build(builder_plan(tmp_path / "b", store, runs, requirement="numpy==2.3.1\n"))
    assert statuses(second)["build-env:venv"] == "reused" and second.ran[:2] == [
        "build-env:deps",
        "build-env:script",
    ]
    kept = [json.loads((e / "meta.json").read_text())["step"] for e in entries(store)]
    assert sorted(kept) == [
        "build-env:deps",
        "build-env:deps",
        "build-env:script",
        "build-env:script",
        "build-env:venv",
    ]


def test_a_damaged_entry_is_not_used(tmp_path: Path) -> None:
    store, runs = tmp_path / "store", tmp_path / "runs.txt"
    build(builder_plan(tmp_path / "a", store, runs))
    for entry in entries(store):
        (entry / "meta.json").write_text("{not json")
    second, _ = build(builder_plan(tmp_path / "b", store, runs))
    assert second.ran[:3] == ["build-env:venv", "build-env:deps", "build-env:script"]


def test_keep_and_restore_round_trip_outputs_and_files(tmp_path: Path) -> None:
    """What a step recorded (a check's build facts) comes back with its venv; the store's files are links."""
    venv = make_venv(tmp_path / "one" / "venv")
    (venv / "bin" / "tool").write_text(f"#!{venv}/bin/python\nprint(1)\n")
    (venv / "bin" / "blob").write_bytes(b"\0" + str(venv).encode())  # binary: never rewritten
    side = tmp_path / "one" / "constraints.txt"
    side.write_text("torch==2.13.0\n")
    store = EnvStore(tmp_path / "store")
    outputs = {"facts": {"torch_version": "2.13.0+cpu"}}
    entry = store.keep("k1", venv, {"constraints.txt": side}, "checks:import", outputs)
    assert entry is not None and store.keep("k1", venv, {}, "again", {}) == entry, "kept once"

    target = tmp_path / "two" / "venv"
    target.mkdir(parents=True)
    (target / "stale").write_text("from an older venv")
    restored = store.restore("k1", target, {"constraints.txt": tmp_path / "two" / "constraints.txt"})
    assert restored is not None and restored.outputs == outputs
    assert not (target / "stale").exists(), "the venv is replaced, not merged"
    assert (target / "bin" / "tool").read_text() == f"#!{target}/bin/python\nprint(1)\n"
    assert (entry / "venv" / "bin" / "tool").read_text() == f"#!{venv}/bin/python\nprint(1)\n"
    assert (target / "bin" / "blob").read_bytes() == b"\0" + str(venv).encode()
    assert (target / "bin" / "python").is_symlink(), "symlinks stay symlinks"
    assert subprocess.run(
        [target / "bin" / "python", "-c", "import sys; print(sys.prefix)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip() == str(target)
    assert (tmp_path / "two" / "constraints.txt").read_text() == "torch==2.13.0\n"
    assert store.restore("missing", target, {}) is None
    assert store.restore("k1", target, {"other.txt": tmp_path / "x"}) is None, "a file it does not hold"


def _site(venv: Path) -> Path:
    return next((venv / "lib").glob("python*/site-packages"))


def _temporaries(store: EnvStore) -> list[str]:
    return sorted(p.name for p in store.root.iterdir() if p.name.startswith(".") and p.name != ".objects")


def test_an_entry_staged_while_its_step_runs_is_whole_only_once_committed(tmp_path: Path) -> None:
    """The post-build check stages its venv's entry while it imports the wheels (issue 38): until the step
    is over nothing under the key is visible; committed, it is the entry keep makes; discarded, nothing is
    left; a key the store has already is not staged again."""
    venv = make_venv(tmp_path / "one" / "venv")
    side = tmp_path / "one" / "constraints.txt"
    side.write_text("torch==2.13.0\n")
    store = EnvStore(tmp_path / "store")
    staged = store.stage("k1", venv)
    assert staged is not None and staged.parent == store.root and staged.name.startswith(".")
    assert store.entry("k1") is None and store.lookup("k1") is None, "not an entry before the commit"
    outputs = {"facts": {"torch_version": "2.13.0+cpu"}}
    entry = store.commit("k1", staged, venv, {"constraints.txt": side}, "checks:import", outputs)
    assert entry == store.entry("k1") and not staged.exists()
    restored = store.restore("k1", tmp_path / "two" / "venv", {"constraints.txt": tmp_path / "two" / "c.txt"})
    assert restored is not None and restored.outputs == outputs
    assert (tmp_path / "two" / "c.txt").read_text() == "torch==2.13.0\n"
    assert store.stage("k1", venv) is None, "kept once"
    gone = store.stage("k2", venv)
    EnvStore.discard(gone)
    assert gone is not None and not gone.exists() and store.entry("k2") is None
    assert _temporaries(store) == []
    assert store.stage("k3", tmp_path / "no-venv") is None


def test_an_adopted_venv_is_the_entry_and_stays_at_its_path_linked_to_it(tmp_path: Path) -> None:
    """The post-build check's venv, which no later step writes, is kept by moving it into the store (a
    rename) and linking it back (issue 47): its files are the entry's own (the same inodes, nothing
    copied), its python runs at its path, the entry restores as a kept one does, and a second adoption of
    the key leaves the venv as it is."""
    venv = make_venv(tmp_path / "one" / "venv")
    (_site(venv) / "pkg").mkdir()
    (_site(venv) / "pkg" / "__init__.py").write_text("VALUE = 7\n")
    (_site(venv) / "single.py").write_text("ONE = 1\n")
    (venv / "bin" / "tool").write_text(f"#!{venv}/bin/python\nimport pkg; print(pkg.VALUE)\n")
    (venv / "bin" / "tool").chmod(0o755)
    inodes = {p: os.stat(_site(venv) / p).st_ino for p in ("pkg/__init__.py", "single.py")}
    side = tmp_path / "one" / "constraints.txt"
    side.write_text("torch==2.13.0\n")
    store = EnvStore(tmp_path / "store")
    outputs = {"facts": {"torch_version": "2.13.0+cpu"}}
    entry = store.adopt("k1", venv, {"constraints.txt": side}, "checks:import", outputs)

    assert entry == store.entry("k1") and _temporaries(store) == []
    found = store.lookup("k1", ["constraints.txt"])
    assert found is not None and found[1]["outputs"] == outputs and found[1]["venv"] == str(venv)
    for name, inode in inodes.items():
        assert os.stat(_site(entry / "venv") / name).st_ino == inode, f"{name}: moved, not copied"
        assert os.stat(_site(venv) / name).st_ino == inode, f"{name}: the venv's is the entry's"
    assert (_site(venv) / "pkg").is_symlink(), "linked to the entry (build.envstore.link_venv)"
    assert linked_origin(venv) == (entry / "venv", str(venv))
    ran = subprocess.run([venv / "bin" / "tool"], capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == "7"
    restored = store.restore("k1", tmp_path / "two" / "venv", {"constraints.txt": tmp_path / "two" / "c.txt"})
    assert restored is not None and restored.outputs == outputs

    again = make_venv(tmp_path / "three" / "venv")
    assert store.adopt("k1", again, {}, "checks:import", {}) == entry, "the store's entry is kept"
    assert linked_origin(again) is None and (again / "bin" / "python").exists(), "left as it was"


def test_a_venv_that_cannot_be_adopted_stays_where_it_was(tmp_path: Path) -> None:
    """Across filesystems (/dev/shm, tmpfs) a rename fails: adopt says so (None: the caller clones) and
    leaves the venv whole at its path and nothing in the store. When another build keeps the same key
    between the check and the rename, the venv is put back, its own, and the other build's entry stays."""
    store = EnvStore(tmp_path / "store")
    shm = Path("/dev/shm")
    if shm.is_dir() and os.stat(shm).st_dev != os.stat(tmp_path).st_dev:
        far = Path(tempfile_dir(shm))
        try:
            venv = make_venv(far / "venv")
            assert store.adopt("k1", venv, {}, "checks:import", {}) is None
            assert (venv / "bin" / "python").exists() and linked_origin(venv) is None
            assert store.entry("k1") is None and _temporaries(store) == []
        finally:
            subprocess.run(["rm", "-rf", str(far)], check=True)

    venv = make_venv(tmp_path / "one" / "venv")
    other = make_venv(tmp_path / "other" / "venv")
    complete = store._complete

    def meanwhile(*args: object) -> None:  # the other build, a process of its own, keeps the key first
        complete(*args)  # type: ignore[arg-type]
        if store.entry("k2") is None:
            EnvStore(store.root).keep("k2", other, {}, "checks:import", {"by": "the other build"})

    store._complete = meanwhile  # type: ignore[method-assign]
    entry = store.adopt("k2", venv, {}, "checks:import", {"by": "this build"})
    found = store.lookup("k2")
    assert (
        entry == store.entry("k2") and found is not None and found[1]["outputs"] == {"by": "the other build"}
    )
    assert (venv / "bin" / "python").exists() and linked_origin(venv) is None, "put back, its own"
    assert _temporaries(store) == []


def test_clone_tree_copies_across_filesystems_when_links_fail(tmp_path: Path) -> None:
    """/dev/shm is another filesystem (tmpfs): cp --link fails there, and a real copy is made."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem to copy across")
    source = tmp_path / "tree"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "f").write_text("x")
    (source / "link").symlink_to("sub/f")
    target = Path(tempfile_dir(shm)) / "clone"
    try:
        clone_tree(source, target)
        assert (target / "sub" / "f").read_text() == "x" and os.readlink(target / "link") == "sub/f"
        assert os.stat(target / "sub" / "f").st_ino != os.stat(source / "sub" / "f").st_ino
    finally:
        subprocess.run(["rm", "-rf", str(target.parent)], check=True)


def tempfile_dir(where: Path) -> str:
    import tempfile

    return tempfile.mkdtemp(dir=where)


def test_relocate_leaves_a_venv_at_its_own_path_alone(tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "venv")
    assert relocate_venv(venv, str(venv), str(venv)) == []


def args(value: str | None) -> argparse.Namespace:
    return argparse.Namespace(env_store=value)


def test_the_store_is_chosen_by_option_then_variable_then_default(tmp_path: Path) -> None:
    assert env_store_from_args(args(str(tmp_path / "s")), {}) == tmp_path / "s"
    assert env_store_from_args(args("off"), {"TORCHKILN_ENV_STORE": str(tmp_path)}) is None
    assert env_store_from_args(args(None), {"TORCHKILN_ENV_STORE": "off"}) is None
    assert env_store_from_args(args(None), {"TORCHKILN_ENV_STORE": str(tmp_path / "v")}) == tmp_path / "v"
    environ = {"TORCHKILN_CACHE_DIR": str(tmp_path / "caches")}
    assert env_store_from_args(args(None), environ) == tmp_path / "caches" / "envs"
    assert default_env_store(environ) == tmp_path / "caches" / "envs"
    with pytest.raises(UsageError, match=r"--env-store: .*\(valid: a directory, or off\)"):
        env_store_from_args(args("~nosuchuser/envs"), {})
    with pytest.raises(UsageError, match=r"^TORCHKILN_ENV_STORE: "):
        env_store_from_args(args(None), {"TORCHKILN_ENV_STORE": "a\nb"})


def test_only_the_last_reused_venv_is_cloned_and_all_are_recorded(tmp_path: Path) -> None:
    """Reused steps in a row clone once (each entry replaces the one before); when the next entry is not
    there, the step before it clones its own venv and the next step runs on it."""
    store, runs = tmp_path / "store", tmp_path / "runs.txt"
    build(builder_plan(tmp_path / "a", store, runs))
    by_step = {json.loads((e / "meta.json").read_text())["step"]: e for e in entries(store)}
    (by_step["build-env:script"] / "meta.json").write_text("[]")  # damaged: not an entry any more
    plan = builder_plan(tmp_path / "b", store, runs)
    second, _ = build(plan)
    assert statuses(second)["build-env:deps"] == "reused" and second.ran[0] == "build-env:script"
    assert runs_of(runs) == ["venv", "deps", "script", "script"]
    assert (plan.paths.venv / "marker.txt").read_text() == "numpy==2.3.0\n", "deps' venv was cloned"
    state = json.loads((plan.paths.workdir / "state.json").read_text())["steps"]
    assert {"build-env:venv", "build-env:deps", "build-env:script"} <= set(state)


# --------------------------------------------------------------------------------------------------
# Issue 27 item 1: a store entry holds exactly what its key's inputs produce. Real venvs, real pip (the
# installs are local wheels: offline), the plan's own venv step (made without ensurepip, for time).
# --------------------------------------------------------------------------------------------------


def pip(venv: Path, *args: str) -> list[str]:
    """Real pip on ``venv`` (``pip --python``: the venv needs no pip of its own); its output lines."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split()


def freeze(venv: Path) -> list[str]:
    return sorted(pip(venv, "freeze"))


def stand_in_plan(root: Path, store: Path | None) -> Plan:
    """The real plan of a torch-only build of a stand-in tree under ``root`` (no compiler cache, one job),
    keeping its venvs in ``store``: what the tests replace steps of."""
    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "setup.py").write_text("# stands in for torch\n")
    (src / "version.txt").write_text("2.13.0a0\n")  # the release the label names (torchkiln.source.version)
    return make_plan(
        load_recipe(RECIPE),
        workdir=root / "work",
        dist=root / "dist",
        source_dirs={"torch": src},
        only="torch",
        cache=resolve_cache(None, kind="none"),
        jobs=1,
        env_store=store,
    )


def pip_plan(root: Path, store: Path | None, wheels: Path) -> Plan:
    """The real plan's venv step (its data: ``fresh``, ``creates``; the venv made without pip), a real pip
    install into the venv, a compile that copies a wheel, publish."""
    plan = stand_in_plan(root, store)
    venv = plan.paths.venv
    made = next(s for s in plan.steps if s.name == "build-env:venv")
    assert made.fresh == str(venv) and made.argv[-2:] == ("--", str(venv))
    wheelhouse = plan.paths.wheelhouse / "torch"
    python = str(venv / "bin" / "python")
    steps = [
        replace(made, argv=(sys.executable, "-m", "venv", "--without-pip", "--", str(venv))),
        Step(
            "build-env:deps",
            "env",
            "",
            (
                sys.executable,
                "-m",
                "pip",
                "--python",
                python,
                "install",
                "--no-index",
                "--find-links",
                str(wheels),
                "--",
                "tinydep",
            ),
            venv=str(venv),
        ),  # fmt: skip
        Step(
            "torch:wheel",
            "compile",
            "torch",
            (
                python,
                "-c",
                "import shutil, sys; shutil.copy(sys.argv[1], sys.argv[2])",
                str(wheels / "torch-2.13.0+cpu-py3-none-any.whl"),
                str(wheelhouse),
            ),
            wheels=str(wheelhouse),
        ),  # fmt: skip
        next(s for s in plan.steps if s.kind == "publish"),
    ]
    return replace(plan, steps=steps)


def stored_distributions(store: Path) -> set[str]:
    from torchkiln.build.envstore import venv_distributions

    return {name for entry in entries(store) for name in venv_distributions(entry / "venv")}


def test_a_venv_the_build_did_not_make_never_reaches_the_store(tmp_path: Path) -> None:
    """The issue's steps: WORK/venv made by hand with six pip-installed, then a build with the store on, and
    the same build with it off: both leave the same venv (without six), and no entry of the store holds six;
    a later work directory gets from the store exactly what the build makes."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name, version in (("six", "1.17.0"), ("tinydep", "1.0"), ("torch", "2.13.0+cpu")):
        tiny_wheel(wheels, name, version)
    store = tmp_path / "store"
    on, off = pip_plan(tmp_path / "on", store, wheels), pip_plan(tmp_path / "off", None, wheels)
    for plan in (on, off):
        make_venv(plan.paths.venv)
        pip(plan.paths.venv, "install", "--no-index", "--find-links", str(wheels), "six")
        assert "six==1.17.0" in freeze(plan.paths.venv)

    _, said = build(on)
    build(off)
    assert freeze(on.paths.venv) == freeze(off.paths.venv) == ["tinydep==1.0"], "the store changes nothing"
    assert f"removed {on.paths.venv}: a venv this build did not make (made afresh)" in said
    assert stored_distributions(store) == {"tinydep-1.0.dist-info"}, "the hand-made venv never reached it"

    third = pip_plan(tmp_path / "third", store, wheels)
    reused, _ = build(third)
    assert statuses(reused)["build-env:deps"] == "reused"
    assert freeze(third.paths.venv) == ["tinydep==1.0"]


def test_a_venv_changed_by_hand_after_the_build_is_made_again_and_not_kept(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name, version in (("six", "1.17.0"), ("tinydep", "1.0"), ("torch", "2.13.0+cpu")):
        tiny_wheel(wheels, name, version)
    store = tmp_path / "store"
    plan = pip_plan(tmp_path / "a", store, wheels)
    build(plan)
    kept = entries(store)
    pip(plan.paths.venv, "install", "--no-index", "--find-links", str(wheels), "six")  # by hand
    again, said = build(plan)
    assert f"{plan.paths.venv} changed since this build made it (added six-1.17.0.dist-info" in said
    assert {statuses(again)[n] for n in ("build-env:venv", "build-env:deps")} <= {"ran", "reused"}
    assert freeze(plan.paths.venv) == ["tinydep==1.0"]
    assert entries(store) == kept and stored_distributions(store) == {"tinydep-1.0.dist-info"}
    third, _ = build(plan)
    assert third.ran == [], "a venv as the build left it is unchanged: a no-op stays a no-op"


# --- large identical files, one copy (torchkiln.files.shared) ------------------------------------------


def _venv_with(path: Path, files: dict[str, bytes], mode: int = 0o644) -> Path:
    """A real venv with ``files`` written into its site-packages, each a new file (as pip writes them)."""
    make_venv(path)
    [site] = path.glob("lib/python*/site-packages")
    for name, data in files.items():
        (site / name).write_bytes(data)
        (site / name).chmod(mode)
    return site


def test_entries_share_one_copy_of_the_large_files_they_have_in_common(tmp_path: Path) -> None:
    """Two venvs made apart with the same 3 MiB library (each Python's NVIDIA wheels, a check venv's torch):
    kept under two keys, both entries and both work-directory venvs are one inode; a file that differs, a
    small one, a .py and one of another mode keep their own. Removing every tree that used an object lets
    the next keep sweep it."""
    lib, other = os.urandom(3 << 20), os.urandom(3 << 20)
    same = {"libbig.so": lib, "small.so": b"x" * 1000, "gen.py": lib}
    a = _venv_with(tmp_path / "w1" / "venv", {**same, "differs.so": other})
    b = _venv_with(tmp_path / "w2" / "venv", {**same, "differs.so": os.urandom(3 << 20)})
    c = _venv_with(tmp_path / "w3" / "venv", {"libbig.so": lib}, mode=0o755)
    store = EnvStore(tmp_path / "store")
    venvs = [site.parents[2] for site in (a, b, c)]
    entries = [store.keep(k, v, {}, "build-env:deps", {}) for k, v in zip("abc", venvs, strict=True)]
    kept = [
        Path(str(e), "venv", site.relative_to(v))
        for e, site, v in zip(entries, (a, b, c), venvs, strict=True)
    ]

    def inode(path: Path) -> int:
        return os.stat(path).st_ino

    one = {inode(d / "libbig.so") for d in (a, b, kept[0], kept[1])}
    assert len(one) == 1 and os.stat(a / "libbig.so").st_nlink == 5  # 2 venvs, 2 entries, the object
    assert (a / "libbig.so").read_bytes() == lib == (b / "libbig.so").read_bytes()
    assert inode(a / "differs.so") != inode(b / "differs.so")
    assert inode(a / "small.so") != inode(b / "small.so")
    assert inode(a / "gen.py") != inode(b / "gen.py")
    assert inode(c / "libbig.so") not in one and (c / "libbig.so").stat().st_mode & 0o777 == 0o755
    objects = sorted(p for p in store.objects.rglob("*") if p.is_file())
    assert len(objects) == 3  # libbig.so, each differs.so (the 0755 libbig.so: its own copy, no object)
    # every tree that used b's differs.so gone: the next keep sweeps its object, and only it
    for gone in (tmp_path / "w2", Path(str(entries[1]))):
        shutil.rmtree(gone)
    d = _venv_with(tmp_path / "w4" / "venv", {"libbig.so": lib})
    store.keep("d", d.parents[2], {}, "build-env:deps", {})
    assert len(sorted(p for p in store.objects.rglob("*") if p.is_file())) == 2
    assert inode(d / "libbig.so") in one


@pytest.mark.parametrize("min_bytes", [1, 2, 4096])
def test_large_files_lists_the_same_with_find_and_without(
    tmp_path: Path, min_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What :func:`shared.large_files` lists, by GNU find and by os.walk (no find on PATH), is each regular
    file of the tree of ``min_bytes`` or more but ``*.py``: sizes about the bound, names find's globbing or a
    NUL-separated listing could get wrong (a newline, a space, a leading dot or dash, bytes that are not
    UTF-8, ``*.py`` as a directory's name), and never a symlink, what a symlinked directory holds, or a fifo."""
    real = tmp_path / "real"
    sizes = {"below": min_bytes - 1, "at": min_bytes, "above": min_bytes + 1}
    expected = set()
    for sub in ("", "deep/er", "x.py", ".hidden", "-dash"):
        base = real / sub
        base.mkdir(parents=True, exist_ok=True)
        for word, size in sizes.items():
            for name in (
                f"{word}.so",
                f"{word}.py",
                f"{word}.pyc",
                f"new\nline {word}",
                f".{word}",
                f"-{word}",
            ):
                (base / name).write_bytes(b"x" * size)
                if size >= min_bytes and not name.endswith(".py"):
                    expected.add(str(base / name))
    odd = os.fsencode(str(real)) + b"/\xff\xfe.so"
    with open(odd, "wb") as handle:
        handle.write(b"x" * min_bytes)
    expected.add(os.fsdecode(odd))
    (real / "link.so").symlink_to(real / "at.so")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big.so").write_bytes(b"x" * (min_bytes + 10))
    (real / "linked-dir").symlink_to(outside, target_is_directory=True)
    os.mkfifo(real / "pipe.so")
    top = tmp_path / "top"  # the tree given as a symlink to it: listed, as os.walk lists it
    top.symlink_to(real, target_is_directory=True)
    as_given = {p.replace(str(real), str(top), 1) for p in expected}

    assert shutil.which("find") is not None  # the real tool, as the build finds it
    with_find = shared.large_files(top, min_bytes)
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))
    assert shutil.which("find") is None
    walked = shared.large_files(top, min_bytes)
    assert len(with_find) == len(set(with_find))
    assert {os.path.normpath(p) for p in with_find} == as_given == {os.path.normpath(p) for p in walked}
