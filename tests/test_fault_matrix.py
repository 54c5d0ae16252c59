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
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from dists import tiny_wheel
from rich.console import Console
from smallfs import fill

from torchkiln.build.loop import BuildOptions, BuildResult, run_build
from torchkiln.cache import resolve_cache
from torchkiln.errors import BuildFailed
from torchkiln.plan.make import make_plan
from torchkiln.plan.model import Plan, Step
from torchkiln.recipe.loader import load_recipe

RECIPE = Path(__file__).parent / "data" / "ext-cpu-test.toml"
ROOT = Path(__file__).resolve().parent.parent
Mount = Callable[[str, str], Path]


def run(plan: Plan, **options: object) -> tuple[BuildResult, str]:
    out = io.StringIO()
    console = Console(file=out, width=400, force_terminal=False)
    result = run_build(plan, BuildOptions(console=console, skip_checks=True, **options))  # type: ignore[arg-type]
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


def test_full_disk_store_clone_into_the_work_directory_is_one_line(tmp_path: Path, mount: Mount) -> None:
    """Issue 27 item 3: a venv cloned from the store into a work directory on a small filesystem. Before:
    15.9 MB of output, [Errno 28] once per file, and advice to remove the store entry. Now: one line naming
    the work directory's filesystem, the space needed against the space free, and that a rerun continues;
    the store entry is untouched and the rerun on a larger filesystem reuses it."""
    store = tmp_path / "store"
    wheels = wheels_dir(tmp_path, big=3 << 20)
    run(venv_plan(tmp_path / "a", tmp_path / "a" / "work", store, wheels))
    kept = store_entries(store)
    small = mount("small", "size=2m")
    plan = venv_plan(tmp_path / "b", small / "work", store, wheels)
    with pytest.raises(BuildFailed) as failed:
        run(plan)
    line = one_line(failed.value)
    assert line.startswith(f"build-env:deps: cloning {plan.paths.venv} from the environment store: ")
    assert f"No space left on device (ENOSPC): the filesystem at {small} has " in line
    assert " free of 2.0 MiB, " in line and " MiB needed; " in line and "a rerun continues" in line
    assert "remove that entry" not in line, "the store is not what is full"
    assert store_entries(store) == kept and not plan.paths.venv.exists()
    remount(small, "size=64m")
    again, _ = run(plan)
    assert {s.name: s.status for s in again.steps}["build-env:deps"] == "reused"
    assert (plan.paths.venv / "lib").is_dir() and again.manifest.is_file()


def test_store_clone_that_runs_out_of_inodes_midway_stops_at_the_first_file(
    tmp_path: Path, mount: Mount
) -> None:
    """Space enough by bytes, too few inodes: the copy fails part way and stops at its first failure (one
    line, saying the filesystem has no inodes left), and leaves no half venv behind."""
    store = tmp_path / "store"
    wheels = wheels_dir(tmp_path, files=300)
    run(venv_plan(tmp_path / "a", tmp_path / "a" / "work", store, wheels))
    small = mount("inodes", "size=64m,nr_inodes=120")
    plan = venv_plan(tmp_path / "b", small / "work", store, wheels)
    with pytest.raises(BuildFailed) as failed:
        run(plan)
    line = one_line(failed.value)
    assert "No space left on device (ENOSPC): the filesystem at" in line and "no free inodes" in line
    assert not plan.paths.venv.exists(), "no half-cloned venv"
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
    notes = [line for line in said.splitlines() if "could not keep" in line]
    assert notes and all("No space left on device (ENOSPC): the filesystem at" in n for n in notes), said
    assert sorted(p.name for p in store.iterdir()) == ["filler"], "no partial entry"
