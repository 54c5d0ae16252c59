"""The fault matrix of issue 27 item 5: every write path on a full filesystem, every directory of the work
directory holding state the build did not make. (Every value handed to a tool, with that tool's own option
or expansion syntax: tests/test_values_to_tools.py, one test per row of docs/values-to-tools.md.)

Each case ends in correct behaviour or a clear error of one line (no traceback), and loses nothing: what
was published stays published, completed steps stay recorded, the environment store stays whole, and the
rerun after the fault is gone continues. Real filesystems (a tmpfs, mounted as root: full, or short of
inodes), real git, real venvs and real pip, real ccache; the plans are the real plan's steps where they are
cheap (fetch, venv, publish) and small stand-ins where the real one would compile or download (a step that
copies a wheel, a pip install of a local wheel).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from kit import ROOT
from kit.dists import tiny_wheel
from kit.smallfs import fill
from rich.console import Console
from test_build_fetch import fetch_recipe_text, git

from torchkiln.build.loop import BuildOptions, BuildResult, run_build
from torchkiln.cache import resolve_cache
from torchkiln.errors import BuildFailed
from torchkiln.plan.make import make_plan
from torchkiln.plan.model import Plan, Step
from torchkiln.recipe.loader import load_recipe, parse_recipe

RECIPE = ROOT / "tests" / "data" / "ext-cpu-test.toml"
Mount = Callable[[str, str], Path]


def run(plan: Plan, **options: object) -> tuple[BuildResult, str]:
    out = io.StringIO()
    console = Console(file=out, width=400, force_terminal=False)
    result = run_build(plan, BuildOptions(console=console, skip_postcheck=True, **options))  # type: ignore[arg-type]
    return result, out.getvalue()


def one_line(error: BaseException) -> str:
    """The error's message, asserted to be one line (what the user reads first, with no traceback)."""
    text = str(error)
    assert "\n" not in text and "Traceback" not in text, text
    assert len(text) < 1200, f"{len(text)} characters"
    return text


def remount(point: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(point)], check=True)


def wheels_dir(root: Path, *, big: int = 0, files: int = 0) -> Path:
    """Local wheels: tinydep (with a ``big``-byte file and ``files`` small ones, for a venv of some size)
    and the torch wheel the stand-in compile copies."""
    wheels = root / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    content = {f"tinydep_data/f{i}.txt": f"{i}\n" for i in range(files)}
    if big:
        content["tinydep_data/big.bin"] = "x" * big
    tiny_wheel(wheels, "tinydep", "1.0", files=content)
    tiny_wheel(wheels, "torch", "2.13.0+cpu")
    return wheels


def venv_plan(root: Path, work: Path, store: Path | None, wheels: Path) -> Plan:
    """The real plan's venv step (made without ensurepip, for time), a real pip install into the venv,
    a compile stand-in that copies a wheel into the wheelhouse, publish."""
    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "setup.py").write_text("# stands in for torch\n")
    (src / "version.txt").write_text("2.13.0a0\n")  # the release the label names (torchkiln.source.version)
    plan = make_plan(
        load_recipe(RECIPE),
        workdir=work,
        dist=root / "dist",
        source_dirs={"torch": src},
        only="torch",
        cache=resolve_cache(None, kind="none"),
        jobs=1,
        env_store=store,
    )
    venv, python = plan.paths.venv, str(plan.paths.venv / "bin" / "python")
    wheelhouse = plan.paths.wheelhouse / "torch"
    made = next(s for s in plan.steps if s.name == "build-env:venv")
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


def store_entries(store: Path) -> dict[str, str]:
    """Each entry of the store and its meta.json (what must stay whole through a fault)."""
    return {
        p.name: (p / "meta.json").read_text() for p in sorted(store.iterdir()) if not p.name.startswith(".")
    }


# --------------------------------------------------------------------------------------------------
# Full filesystems: one case per write path.
# --------------------------------------------------------------------------------------------------


def with_extra(plan: Plan, wheels: Path, name: str) -> Plan:
    """``plan`` with a step after build-env:deps that pip-installs ``name`` into the venv (a key the store
    has only for the builder that ran it)."""
    python = str(plan.paths.venv / "bin" / "python")
    pip = (sys.executable, "-m", "pip", "--python", python, "install", "--no-index", "--find-links")
    extra = Step("build-env:extra", "env", "", (*pip, str(wheels), "--", name), venv=str(plan.paths.venv))
    at = [s.name for s in plan.steps].index("build-env:deps") + 1
    return replace(plan, steps=[*plan.steps[:at], extra, *plan.steps[at:]])


def test_full_disk_store_clone_into_the_work_directory_is_one_line(tmp_path: Path, mount: Mount) -> None:
    """Issue 27 item 3: a venv cloned from the store into a work directory on a small filesystem. Before:
    15.9 MB of output, [Errno 28] once per file, and advice to remove the store entry. Now the venv is
    linked to its entry (issue 47), which needs no room for its files: the build in the small filesystem
    takes it. A step that installs into it needs files of its own (a copy, the store being on another
    filesystem): that fails in one line naming the work directory's filesystem, the space needed against
    the space free, and that a rerun continues; the store entry is untouched and the rerun on a larger
    filesystem reuses it."""
    store = tmp_path / "store"
    wheels = wheels_dir(tmp_path, big=3 << 20)
    tiny_wheel(wheels, "six", "1.17.0")
    tiny_wheel(wheels, "seven", "1.0")
    run(with_extra(venv_plan(tmp_path / "a", tmp_path / "a" / "work", store, wheels), wheels, "six"))
    kept = store_entries(store)
    small = mount("small", "size=2m")
    linked, _ = run(venv_plan(tmp_path / "l", small / "linked", store, wheels))
    assert {s.name: s.status for s in linked.steps}["build-env:deps"] == "reused", "linked: no room needed"
    plan = with_extra(venv_plan(tmp_path / "b", small / "work", store, wheels), wheels, "seven")
    with pytest.raises(BuildFailed) as failed:
        run(plan)
    line = one_line(failed.value)
    assert line.startswith(f"build-env:extra: cloning {plan.paths.venv} from the environment store: ")
    assert f"No space left on device (ENOSPC): the filesystem at {small} has " in line
    assert " free of 2.0 MiB, " in line and " MiB needed; " in line and "a rerun continues" in line
    assert "remove that entry" not in line, "the store is not what is full"
    assert store_entries(store) == kept and not [
        p for p in (small / "work").iterdir() if p.name.startswith(".")
    ]
    remount(small, "size=64m")
    again, _ = run(plan)
    assert {s.name: s.status for s in again.steps}["build-env:deps"] == "reused"
    assert {s.name: s.status for s in again.steps}["build-env:extra"] == "ran" and again.manifest.is_file()


def test_store_clone_that_runs_out_of_inodes_midway_stops_at_the_first_file(
    tmp_path: Path, mount: Mount
) -> None:
    """Space enough by bytes, too few inodes: the copy a step installing into a linked venv needs fails part
    way and stops at its first failure (one line, saying the filesystem has no inodes left), and leaves no
    half venv behind."""
    store = tmp_path / "store"
    wheels = wheels_dir(tmp_path, files=300)
    tiny_wheel(wheels, "six", "1.17.0")
    tiny_wheel(wheels, "seven", "1.0")
    run(with_extra(venv_plan(tmp_path / "a", tmp_path / "a" / "work", store, wheels), wheels, "six"))
    small = mount("inodes", "size=64m,nr_inodes=120")
    plan = with_extra(venv_plan(tmp_path / "b", small / "work", store, wheels), wheels, "seven")
    with pytest.raises(BuildFailed) as failed:
        run(plan)
    line = one_line(failed.value)
    assert "No space left on device (ENOSPC): the filesystem at" in line and "no free inodes" in line
    assert not [p for p in (small / "work").iterdir() if p.name.startswith(".")], "no half-cloned venv"
    remount(small, "nr_inodes=100000")
    again, _ = run(plan)
    assert again.manifest.is_file()


def test_full_store_does_not_stop_the_build_one_note(tmp_path: Path, mount: Mount) -> None:
    """The store's own filesystem full: the build goes on (the next work directory pays), one note, no
    partial entry left in the store."""
    store = mount("store", "size=256k")
    fill(store)
    wheels = wheels_dir(tmp_path, big=1 << 20)
    result, said = run(venv_plan(tmp_path / "a", tmp_path / "a" / "work", store, wheels))
    assert result.manifest.is_file()
    # the console wraps a note whose paths are long (a deep basetemp): each note read as one text
    notes = " ".join(said.split()).split("could not keep")[1:]
    assert notes and all("No space left on device (ENOSPC): the filesystem at" in n for n in notes), said
    assert sorted(p.name for p in store.iterdir()) == ["filler"], "no partial entry"


def fetch_plan(work: Path, dist: Path, url: str) -> Plan:
    """The real plan's fetch steps and publish (real git, a local repository: nothing compiles)."""
    recipe = parse_recipe(fetch_recipe_text(url, "v1").encode(), "fetch-test.toml")
    plan = make_plan(
        recipe, workdir=work, dist=dist, only="torch", cache=resolve_cache(recipe.cache, kind="none")
    )
    return replace(plan, steps=[s for s in plan.steps if s.kind in ("fetch", "publish")])


def test_full_disk_under_the_checkout_fails_on_one_line_and_the_rerun_fetches(
    tmp_path: Path, repo: dict[str, str], mount: Mount
) -> None:
    full = mount("src", "size=256k")
    filler = fill(full)
    work = tmp_path / "work"
    work.mkdir()
    (work / "src").symlink_to(full)
    plan = fetch_plan(work, tmp_path / "dist", repo["url"])
    with pytest.raises(BuildFailed) as failed:
        run(plan)
    first = str(failed.value).splitlines()[0]
    assert first.startswith("torch:fetch:") and f": out of space: the filesystem at {full} has " in first, (
        first
    )
    assert first.endswith("completed steps are kept, a rerun continues")
    assert not (tmp_path / "dist").exists() or not any((tmp_path / "dist").iterdir()), "nothing published"
    filler.unlink()
    again, _ = run(plan)
    assert git(work / "src" / "pytorch", "rev-parse", "HEAD") == repo["v1"] and again.manifest.is_file()


def test_full_disk_under_the_wheelhouse_fails_on_one_line_and_keeps_the_venv(
    tmp_path: Path, mount: Mount
) -> None:
    wheels = wheels_dir(tmp_path)
    work = tmp_path / "work"
    plan = venv_plan(tmp_path, work, None, wheels)
    full = mount("wheelhouse", "size=64k")
    work.mkdir()
    (work / "wheelhouse").symlink_to(full)
    filler = fill(full)
    with pytest.raises(BuildFailed) as failed:
        run(plan)
    first = str(failed.value).splitlines()[0]
    assert (
        first.startswith("torch:wheel failed (exit 1)") and f"out of space: the filesystem at {full}" in first
    )
    filler.unlink()
    again, _ = run(plan)
    assert again.ran == ["torch:wheel", "publish"], "the env steps were kept: the rerun continues"


def test_full_disk_while_making_the_venv_fails_on_one_line(tmp_path: Path, mount: Mount) -> None:
    """The work directory's own filesystem short of inodes: lock, state and the venv step's start fit, the
    venv does not. The step fails naming that filesystem; once it has room, the rerun makes the venv."""
    wheels = wheels_dir(tmp_path)
    small = mount("work", "size=64m,nr_inodes=16")
    work = small / "work"
    work.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    (work / "logs").symlink_to(logs)
    plan = venv_plan(tmp_path, work, None, wheels)
    with pytest.raises(BuildFailed) as failed:
        run(plan)
    first = str(failed.value).splitlines()[0]
    assert first.startswith("build-env:venv failed") and "out of space: the filesystem at" in first, first
    remount(small, "nr_inodes=100000")
    again, _ = run(plan)
    assert again.ran[:2] == ["build-env:venv", "build-env:deps"] and again.manifest.is_file()


def test_full_compiler_cache_still_builds_with_real_ccache(tmp_path: Path, mount: Mount) -> None:
    """ccache with a full cache directory runs the compiler anyway (it counts a preprocessor_error and
    compiles uncached): the build publishes, with one warning that nothing is cached."""
    if shutil.which("ccache") is None or shutil.which("gcc") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("ccache and gcc are installed in CI")
        pytest.skip("needs ccache and gcc")
    cache = mount("ccache", "size=256k")
    fill(cache)
    wheels = wheels_dir(tmp_path)
    plan = venv_plan(tmp_path, tmp_path / "work", None, wheels)
    source = tmp_path / "hello.c"
    source.write_text("int main(void) { return 0; }\n")
    compile_step = replace(
        plan.steps[2],
        argv=(sys.executable, "-c",
              "import shutil, subprocess, sys; subprocess.run(['ccache', 'gcc', '-c', sys.argv[1], '-o', "
              "sys.argv[4]], check=True); shutil.copy(sys.argv[2], sys.argv[3])",
              str(source), str(wheels / "torch-2.13.0+cpu-py3-none-any.whl"), str(plan.paths.wheelhouse / "torch"),
              str(plan.paths.workdir / "hello.c.o")),  # a build step writes where the build lets it
    )  # fmt: skip
    plan = replace(plan, cache=resolve_cache(None, kind="ccache", dir=cache / "ccache"))
    plan = replace(plan, steps=[plan.steps[0], plan.steps[1], compile_step, plan.steps[3]])
    result, said = run(plan)
    manifest = json.loads(result.manifest.read_text())
    warning = f"compiler cache {cache / 'ccache'}: the filesystem at {cache} has 0 B free of 256.0 KiB: compiles run"
    assert warning in said and any(w.startswith(warning) for w in manifest["warnings"])
    assert manifest["cache"]["tool"] == "ccache" and manifest["cache"]["hits"] == 0
    assert (plan.paths.workdir / "hello.c.o").is_file(), "ccache ran the compiler"


# --------------------------------------------------------------------------------------------------
# State the build did not make, in each directory of the work directory (and dist/).
# --------------------------------------------------------------------------------------------------


def test_state_in_venv_a_hand_made_venv_is_made_afresh_and_never_kept(tmp_path: Path) -> None:
    wheels = wheels_dir(tmp_path)
    tiny_wheel(wheels, "six", "1.17.0")
    store = tmp_path / "store"
    plan = venv_plan(tmp_path, tmp_path / "work", store, wheels)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(plan.paths.venv)], check=True)
    python = str(plan.paths.venv / "bin" / "python")
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-index",
                    "--find-links", str(wheels), "six"], check=True)  # fmt: skip
    _, said = run(plan)
    assert f"removed {plan.paths.venv}: a venv this build did not make" in said
    installed = [p.name for p in (plan.paths.venv / "lib").glob("python*/site-packages/*.dist-info")]
    assert installed == ["tinydep-1.0.dist-info"]
    kept = [p.name for p in store.glob("*/venv/lib/python*/site-packages/*.dist-info")]
    assert kept and set(kept) == {"tinydep-1.0.dist-info"}


def test_state_in_src_a_foreign_checkout_is_fetched_over(tmp_path: Path, repo: dict[str, str]) -> None:
    work = tmp_path / "work"
    foreign = work / "src" / "pytorch"
    foreign.mkdir(parents=True)
    git(foreign, "init", "-q")
    (foreign / "FOREIGN").write_text("another project\n")
    git(foreign, "add", "FOREIGN")
    git(foreign, "commit", "-qm", "foreign")
    result, _ = run(fetch_plan(work, tmp_path / "dist", repo["url"]))
    assert not (foreign / "FOREIGN").exists() and (foreign / "VERSION").read_text() == "v1"
    assert json.loads(result.lock.read_text())["sources"]["torch"]["commit"] == repo["v1"]


def compile_plan(tmp_path: Path, flag: str, fail: Path) -> Plan:
    """A --source-dir tree with an in-tree build/ the compile owns (``scratch``); the stand-in compile
    writes into build/ and fails while ``fail`` exists (as a compile that stops half way)."""
    wheels = wheels_dir(tmp_path)
    plan = venv_plan(tmp_path, tmp_path / "work", None, wheels)
    src = tmp_path / "src"
    step = replace(
        plan.steps[2],
        argv=(sys.executable, "-c",
              "import os, shutil, sys; open(os.path.join(sys.argv[1], 'object.o'), 'a').write('o'); "
              "sys.exit(1) if os.path.exists(sys.argv[4]) else shutil.copy(sys.argv[2], sys.argv[3])",
              str(src / "build"), str(wheels / "torch-2.13.0+cpu-py3-none-any.whl"),
              str(plan.paths.wheelhouse / "torch"), str(fail)),
        env={**plan.steps[2].env, "USE_KINETO": flag},
        scratch=(str(src / "build"),),
    )  # fmt: skip
    return replace(plan, steps=[plan.steps[0], plan.steps[1], step, plan.steps[3]])


def test_state_in_build_an_in_tree_build_dir_configured_elsewhere_is_configured_again(tmp_path: Path) -> None:
    """setup.py does not run CMake again in a configured build/: one the compile did not configure with its
    settings would build without the recipe's flags. Its CMake cache goes (CMake configures anew, as
    setup.py's --cmake does) and the compiled objects stay; a build/ it configured with the same settings is
    left alone (a rerun after a failed compile continues incrementally). torchkiln.build.reconfigure."""
    fail = tmp_path / "fail"
    build = tmp_path / "src" / "build"
    build.mkdir(parents=True)
    (build / "CMakeCache.txt").write_text("USE_KINETO:BOOL=ON\n")  # configured by someone else
    fail.write_text("x")
    with pytest.raises(BuildFailed):
        run(compile_plan(tmp_path, "0", fail))
    assert not (build / "CMakeCache.txt").exists() and (build / "object.o").read_text() == "o"
    fail.unlink()
    (build / "CMakeCache.txt").write_text("USE_KINETO:BOOL=OFF\n")  # as its own configure left it
    _, said = run(compile_plan(tmp_path, "0", fail))
    assert (build / "CMakeCache.txt").exists() and "CMake configures it again" not in said
    assert (build / "object.o").read_text() == "oo", "its own build/ is kept: incremental"
    _, said = run(compile_plan(tmp_path, "1", fail))
    assert not (build / "CMakeCache.txt").exists() and "USE_KINETO 0 -> 1" in said, said
    assert (build / "object.o").read_text() == "ooo", "other settings: configured anew, objects kept"


def test_state_in_logs_a_latest_that_is_a_directory_and_files_of_the_users(
    tmp_path: Path, repo: dict[str, str]
) -> None:
    work = tmp_path / "work"
    (work / "logs" / "latest").mkdir(parents=True)
    (work / "logs" / "notes").mkdir()
    (work / "logs" / "notes" / "mine.txt").write_text("kept\n")
    result, _ = run(fetch_plan(work, tmp_path / "dist", repo["url"]))
    assert (work / "logs" / "latest").is_symlink() and (
        work / "logs" / "latest" / "torch-fetch-init.log"
    ).is_file()
    assert (work / "logs" / "notes" / "mine.txt").read_text() == "kept\n" and result.manifest.is_file()


def test_state_in_wheelhouse_a_wheel_the_build_did_not_make_is_never_published(tmp_path: Path) -> None:
    wheels = wheels_dir(tmp_path)
    plan = venv_plan(tmp_path, tmp_path / "work", None, wheels)
    stray_dir = tmp_path / "stray"
    stray_dir.mkdir()
    stray = tiny_wheel(stray_dir, "torch", "2.13.0+cpu", files={"torch_extra.py": "STRAY = True\n"})
    house = plan.paths.wheelhouse / "torch"
    house.mkdir(parents=True)
    shutil.copy(stray, house)  # before the first build: the compile starts from an empty directory
    first, _ = run(plan)
    ours = (tmp_path / "dist" / stray.name).read_bytes()
    assert ours == (wheels / stray.name).read_bytes()
    other = tiny_wheel(stray_dir, "torch", "2.13.0+cpu.other")
    shutil.copy(other, house)  # after it: the compile is no longer intact, it runs again
    again, _ = run(plan)
    assert "torch:wheel" in again.ran and sorted(p.name for p in house.iterdir()) == [stray.name]
    assert sorted(p.name for p in (tmp_path / "dist").glob("*.whl")) == [stray.name]


def test_state_in_dist_the_users_files_stay_and_the_manifest_describes_this_build(
    tmp_path: Path, repo: dict[str, str]
) -> None:
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "notes.txt").write_text("mine\n")
    (dist / "manifest.json").write_text('{"from": "another build"}\n')
    result, _ = run(fetch_plan(tmp_path / "work", dist, repo["url"]))
    assert (dist / "notes.txt").read_text() == "mine\n"
    assert json.loads(result.manifest.read_text())["recipe"]["name"] == "fetch-test"
