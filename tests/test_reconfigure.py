"""A changed configuration reaches CMake on rerun (torchkiln.build.reconfigure).

The real-tree test builds tests/data/cmake_flag_project with torch 2.6.0's own tools/build_pytorch_libs.py and
tools/setup_helpers/ (copied from the real release tree of tests/kit/realtrees.py), real CMake, ninja and the
C compiler: first as upstream's code alone does on a rerun (the old configuration stays), then as torchkiln's
compile step runs it (the new value is in the built program).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from kit import ROOT
from kit.imagekit import need
from rich.console import Console

from torchkiln.build.loop import BuildOptions, run_build
from torchkiln.build.reconfigure import RECORD, UNKNOWN, reconfigure
from torchkiln.cache import resolve_cache
from torchkiln.errors import TorchkilnError
from torchkiln.plan.make import make_plan
from torchkiln.plan.model import Step
from torchkiln.recipe.loader import load_recipe

HERE = ROOT / "tests"
PROJECT = HERE / "data" / "cmake_flag_project"
# What torch 2.6.0's setup.py imports to build torch: tools/build_pytorch_libs.py and tools/setup_helpers/.
TORCH_BUILD_CODE = ("tools/__init__.py", "tools/build_pytorch_libs.py", "tools/setup_helpers")


def configured(build_dir: Path, **env: str) -> None:
    """A build dir as a configure with ``env`` leaves it (the record, then CMake's cache)."""
    assert reconfigure(build_dir, env) is None
    (build_dir / "CMakeCache.txt").write_text("USE_KILN_FEATURE:BOOL=0\n")
    (build_dir / "build.ninja").write_text("")


def test_a_changed_flag_drops_the_cache_and_keeps_the_objects(tmp_path: Path) -> None:
    build_dir = tmp_path / "build"
    configured(build_dir, USE_KILN_FEATURE="0", MAX_JOBS="2")
    (build_dir / "obj.o").write_bytes(b"compiled")
    done = reconfigure(build_dir, {"USE_KILN_FEATURE": "1", "MAX_JOBS": "2"})
    assert done is not None and done.changed == ("USE_KILN_FEATURE 0 -> 1",)
    assert not (build_dir / "CMakeCache.txt").exists()
    assert (build_dir / "obj.o").read_bytes() == b"compiled" and (build_dir / "build.ninja").exists()
    assert json.loads((build_dir / RECORD).read_text()) == {"USE_KILN_FEATURE": "1"}


def test_an_unchanged_configuration_keeps_the_cache(tmp_path: Path) -> None:
    build_dir = tmp_path / "build"
    configured(build_dir, USE_KILN_FEATURE="1", MAX_JOBS="2")
    # parallelism and the wheel's timestamps never reach configure
    assert (
        reconfigure(build_dir, {"USE_KILN_FEATURE": "1", "MAX_JOBS": "16", "SOURCE_DATE_EPOCH": "9"}) is None
    )
    assert (build_dir / "CMakeCache.txt").exists()


def test_a_removed_flag_and_an_unknown_configuration_drop_the_cache(tmp_path: Path) -> None:
    build_dir = tmp_path / "build"
    configured(build_dir, USE_KILN_FEATURE="1", BLAS="MKL")
    done = reconfigure(build_dir, {"USE_KILN_FEATURE": "1"})
    assert done is not None and done.changed == ("BLAS MKL -> (unset)",)
    # a cache nobody recorded (a build dir from before torchkiln, or a hand-run setup.py): unknown, dropped;
    # an ExternalProject's cache below it is that project's own
    (build_dir / RECORD).unlink()
    (build_dir / "CMakeCache.txt").write_text("")
    external = build_dir / "nccl_external-prefix" / "src" / "nccl_external-build" / "CMakeCache.txt"
    external.parent.mkdir(parents=True)
    external.write_text("")
    done = reconfigure(build_dir, {"USE_KILN_FEATURE": "1"})
    assert done is not None and done.changed == (UNKNOWN,)
    assert done.removed == (build_dir / "CMakeCache.txt",) and external.exists()


def test_a_scikit_build_core_build_dir_below_build_is_found(tmp_path: Path) -> None:
    build_dir = tmp_path / "build"
    cache = build_dir / "cp312-cp312-linux_x86_64" / "CMakeCache.txt"  # build-dir = "build/{wheel_tag}"
    cache.parent.mkdir(parents=True)
    cache.write_text("")
    done = reconfigure(build_dir, {"TORCH_CUDA_ARCH_LIST": "9.0"})
    assert done is not None and done.removed == (cache,) and not cache.exists()


def run(program: Path) -> str:
    """What a program the build made prints (its configuration). Afterwards the installed copy is dated an
    hour back, as a real build's previous install is: CMake's install step skips a file whose time equals the
    new build output's to the second ("Up-to-date"), which a rebuild within the same second hits."""
    program.chmod(0o755)
    said = subprocess.run([str(program)], capture_output=True, text=True, check=True).stdout.strip()
    earlier = program.stat().st_mtime - 3600
    os.utime(program, (earlier, earlier))
    return said


def clean_env() -> dict[str, str]:
    """This process's environment without the variables a build forwards to CMake."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("USE_", "BUILD_", "CMAKE_", "KILN_"))}


def compile_step(tree: Path, argv: tuple[str, ...], env: dict[str, str], tmp_path: Path) -> str:
    """``argv`` run in ``tree`` as torchkiln runs torch's compile step (its build/ as scratch), alone in a
    plan; what the build showed."""
    recipe = load_recipe(HERE / "data" / "ext-cpu-test.toml")
    cache = resolve_cache(recipe.cache, kind="none")
    # the tree is the plan's torch tree: a compile step's sandbox writes to the plan's trees and work directory
    plan = make_plan(
        recipe,
        workdir=tmp_path / "work",
        dist=tmp_path / "dist",
        only="torch",
        cache=cache,
        source_dirs={"torch": tree},
    )
    step = Step("torch:wheel", "compile", "torch", argv, env, str(tree), scratch=(str(tree / "build"),))
    out = io.StringIO()
    options = BuildOptions(console=Console(file=out, width=200), skip_postcheck=True)
    with pytest.raises(TorchkilnError, match="no publish step"):  # the step alone: it publishes nothing
        run_build(replace(plan, steps=[step]), options)
    return " ".join(out.getvalue().split())  # as shown, without the console's wrapping


@pytest.mark.integration
def test_a_changed_flag_reaches_the_build_through_torchs_real_setup_helpers(
    pytorch_2_6_tree: Path, tmp_path: Path
) -> None:
    """torch 2.6.0's setup.py front-end: tools/build_pytorch_libs.py and tools/setup_helpers/ of the real tree."""
    for tool in ("cmake", "ninja", "cc"):
        need(tool)
    tree = tmp_path / "tree"
    shutil.copytree(PROJECT, tree)
    for name in TORCH_BUILD_CODE:
        source = pytorch_2_6_tree / name
        if source.is_dir():
            shutil.copytree(source, tree / name)
        else:
            (tree / name).parent.mkdir(exist_ok=True)
            shutil.copy(source, tree / name)
    program = (
        tree / "torch" / "bin" / "show_feature"
    )  # installed into the tree's torch/, as torch's build does

    def upstream(flag: str) -> str:
        """drive.py as setup.py runs it, without torchkiln."""
        env = {**clean_env(), "USE_KILN_FEATURE": flag, "CMAKE_GENERATOR": "Ninja", "BUILD_TEST": "0"}
        done = subprocess.run([sys.executable, "drive.py"], cwd=tree, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    assert "-DUSE_KILN_FEATURE=0" in upstream("0") and run(program) == "USE_KILN_FEATURE=0 KILN_ARCH_LIST="
    # upstream's own code on a rerun: "Everything's in place. Do not rerun." -- CMake never sees the new value
    assert "-DUSE_KILN_FEATURE" not in upstream("1") and run(program) == "USE_KILN_FEATURE=0 KILN_ARCH_LIST="

    def torchkiln(flag: str) -> str:
        # The installed copy goes first: run() dated it back (CMake's install skips a file of the same second),
        # so it is no longer what a step recorded, and a tree without git has no commit to tell its origin: a
        # file there before the build, changed outside build/ and not as the build left it, is the tree's, and
        # the build refuses to change it (build.treewatch). A torch checkout ignores torch/bin/ in git.
        program.unlink(missing_ok=True)
        env = {"USE_KILN_FEATURE": flag, "CMAKE_GENERATOR": "Ninja", "BUILD_TEST": "0"}
        return compile_step(tree, (sys.executable, "drive.py"), env, tmp_path)

    # the build dir upstream's code left is configured with USE_KILN_FEATURE=0, and nobody recorded it. What
    # that build installed into the tree goes: a tree without git has no commit to tell a file's origin, so a
    # file there before the build that a step changes outside build/ is the tree's, and the build refuses to
    # change it (build.treewatch); a torch checkout ignores torch/bin/ in git, where it is an output.
    program.unlink()
    said = torchkiln("1")
    assert run(program) == "USE_KILN_FEATURE=1 KILN_ARCH_LIST="
    assert "CMake configures it again" in said and UNKNOWN in said
    said = torchkiln("0")
    assert run(program) == "USE_KILN_FEATURE=0 KILN_ARCH_LIST=" and "USE_KILN_FEATURE 1 -> 0" in said
    log = max((tmp_path / "work").rglob("torch-wheel.log"), key=lambda p: p.stat().st_mtime_ns)
    assert "-DUSE_KILN_FEATURE=0" in log.read_text(), "setup_helpers ran CMake with the new value"


@pytest.mark.integration
def test_a_changed_passthrough_variable_reaches_a_scikit_build_core_wheel(tmp_path: Path) -> None:
    """The scikit-build-core front-end (torch 2.14+): it runs CMake on every build, but a passthrough variable
    already in the kept build-dir's cache wins over the environment; the wheel has the new value only because
    torchkiln dropped the cache."""
    for tool in ("cmake", "ninja", "cc"):
        need(tool)
    if importlib.util.find_spec("scikit_build_core") is None:  # the [test] extra installs it
        if os.environ.get("CI") == "true":
            pytest.fail("scikit-build-core is required in CI")
        pytest.skip("scikit-build-core is not installed")
    tree = tmp_path / "tree"
    shutil.copytree(PROJECT, tree)
    wheels = tmp_path / "work" / "out"  # in the work directory: a compile step writes there and to its tree
    argv = (sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(wheels), str(tree))

    def built() -> str:
        """What the program in the newest wheel prints."""
        wheel = max(wheels.glob("*.whl"), key=lambda p: p.stat().st_mtime_ns)
        target = tmp_path / f"unpacked-{wheel.stat().st_mtime_ns}"
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(target)
        return run(target / "kiln_flag" / "show_feature")

    def upstream(arch: str) -> str:
        done = subprocess.run(
            argv, env={**clean_env(), "KILN_ARCH_LIST": arch}, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return built()

    assert upstream("8.0") == "USE_KILN_FEATURE=0 KILN_ARCH_LIST=8.0"
    assert upstream("9.0") == "USE_KILN_FEATURE=0 KILN_ARCH_LIST=8.0", (
        "the kept cache won over the environment"
    )
    said = compile_step(tree, argv, {"KILN_ARCH_LIST": "9.0"}, tmp_path)
    assert built() == "USE_KILN_FEATURE=0 KILN_ARCH_LIST=9.0"
    assert "CMake configures it again" in said
