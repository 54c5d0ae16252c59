"""Preflight (issue 11): ``torchkiln check`` and ``build`` refuse a build the host cannot do, every reason at
once, before anything is fetched. Real tools where this machine has them (gcc, git, the Pythons on PATH), a
fake toolkit tree (nvcc, cuDNN and NCCL headers, MAGMA) for the rest."""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from kit import ROOT
from kit.imagekit import require

from torchkiln.cli import main
from torchkiln.plan import preflight, preflight_machine
from torchkiln.plan.jobs import GIB, Resources
from torchkiln.plan.make import make_plan
from torchkiln.plan.model import Plan
from torchkiln.plan.preflight_findings import Finding
from torchkiln.plan.source_adoption import adopt_source_versions
from torchkiln.recipe.loader import load_recipe
from torchkiln.source.version import tree_version

CU130 = ROOT / "recipes" / "torch-2.13-cu130-py312.toml"
CPU = ROOT / "recipes" / "torch-2.13-cpu-py311.toml"
VISION_LIKE = ROOT / "tests" / "data" / "vision_like"
BIG = Resources(cpus=4, memory_bytes=64 * GIB)


def script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def bin_dir(tmp_path: Path, *tools: str) -> Path:
    """A PATH directory with only the named real tools (symlinks), so the checks see exactly those."""
    out = tmp_path / "bin"
    out.mkdir(exist_ok=True)
    for tool in tools:
        real = shutil.which(tool)
        require(real is not None, f"{tool} is not installed")
        (out / tool).symlink_to(real)
    return out


def fake_toolkit(root: Path, *, cuda: str = "13.0", cudnn: str = "9.20.0", nccl: str = "2.29.7") -> Path:
    """A CUDA toolkit tree as the checks read it: bin/nvcc, cudnn_version.h, nccl.h."""
    script(root / "bin" / "nvcc", f'echo "Cuda compilation tools, release {cuda}, V{cuda}.88"\n')
    major, minor, patch = cudnn.split(".")
    (root / "include").mkdir(parents=True, exist_ok=True)
    (root / "include" / "cudnn_version.h").write_text(
        f"#define CUDNN_MAJOR {major}\n#define CUDNN_MINOR {minor}\n#define CUDNN_PATCHLEVEL {patch}\n"
    )
    n_major, n_minor, n_patch = nccl.split(".")
    (root / "include" / "nccl.h").write_text(
        f"#define NCCL_MAJOR {n_major}\n#define NCCL_MINOR {n_minor}\n#define NCCL_PATCH {n_patch}\n"
    )
    return root


def fake_magma(root: Path, version: str = "2.6.1") -> Path:
    major, minor, micro = version.split(".")
    (root / "include").mkdir(parents=True)
    (root / "lib").mkdir()
    (root / "include" / "magma_v2.h").write_text("/* magma */\n")
    (root / "include" / "magma_types.h").write_text(
        f"#define MAGMA_VERSION_MAJOR {major}\n#define MAGMA_VERSION_MINOR {minor}\n"
        f"#define MAGMA_VERSION_MICRO {micro}\n"
    )
    (root / "lib" / "libmagma.a").write_bytes(b"!<arch>\n")
    return root


def relocated(plan: Plan, **env: str) -> Plan:
    """The plan with its compile steps' CUDA_HOME / NCCL_INCLUDE_DIR / MAGMA_HOME pointing elsewhere."""
    steps = [dataclasses.replace(s, env={**s.env, **env}) if s.kind == "compile" else s for s in plan.steps]
    return dataclasses.replace(plan, steps=steps)


def checks(findings: list[Finding]) -> set[str]:
    return {f.check for f in findings}


def cu130_plan(tmp_path: Path) -> Plan:
    return make_plan(load_recipe(CU130), workdir=tmp_path / "w", dist=tmp_path / "d", resources=BIG)


def test_cu130_on_a_bare_host_lists_every_missing_piece(tmp_path: Path) -> None:
    path = bin_dir(tmp_path, "gcc", "git")  # no gcc-13 (the recipe's build.gcc), no python3.12
    found = preflight.preflight(cu130_plan(tmp_path), {"PATH": str(path)})
    lines = [str(f) for f in found]
    assert {"python", "cudnn", "nccl", "magma", "cc", "cxx"} <= checks(found), lines
    # build.gcc = 13 is what the build runs (CC=gcc-13, CXX=g++-13): their absence is named
    assert [f.found for f in found if f.check in ("cc", "cxx")] == [
        "$CXX=g++-13, and no g++-13 on PATH",
        "$CC=gcc-13, and no gcc-13 on PATH",
    ], lines
    python = next(f for f in found if f.check == "python")
    assert "python3.12" in python.found and "3.12" in python.wanted and python.fix
    for f in found:  # each names what was found, what is wanted and the fix
        assert f.found and f.wanted and f.fix
        assert str(f).startswith(f"host: {f.check}: found ")


def test_a_complete_fake_toolkit_passes_the_cuda_checks(tmp_path: Path) -> None:
    cuda = fake_toolkit(tmp_path / "cuda")
    magma = fake_magma(tmp_path / "magma")
    plan = relocated(
        cu130_plan(tmp_path),
        CUDA_HOME=str(cuda),
        CUDACXX=str(cuda / "bin" / "nvcc"),
        NCCL_INCLUDE_DIR=str(cuda / "include"),
        MAGMA_HOME=str(magma),
    )
    found = preflight.preflight(plan, {"PATH": str(bin_dir(tmp_path, "git"))})
    assert not checks(found) & {"nvcc", "cudnn", "nccl", "magma"}, [str(f) for f in found]


@pytest.mark.parametrize(
    ("toolkit", "check", "words"),
    [
        ({"cuda": "12.8"}, "nvcc", "CUDA 12.8"),
        ({"cudnn": "9.10.2"}, "cudnn", "cuDNN 9.10.2"),
        ({"nccl": "2.27.7"}, "nccl", "NCCL 2.27.7"),
    ],
)
def test_wrong_toolkit_versions_are_named(
    tmp_path: Path, toolkit: dict[str, str], check: str, words: str
) -> None:
    cuda = fake_toolkit(tmp_path / "cuda", **toolkit)
    plan = relocated(
        cu130_plan(tmp_path),
        CUDA_HOME=str(cuda),
        CUDACXX=str(cuda / "bin" / "nvcc"),
        NCCL_INCLUDE_DIR=str(cuda / "include"),
    )
    found = [f for f in preflight.preflight(plan, {"PATH": ""}) if f.check == check]
    assert found and words in found[0].found, [str(f) for f in found]


def test_magma_of_another_version_is_named(tmp_path: Path) -> None:
    plan = relocated(cu130_plan(tmp_path), MAGMA_HOME=str(fake_magma(tmp_path / "magma", "2.5.4")))
    found = [f for f in preflight.preflight(plan, {"PATH": ""}) if f.check == "magma"]
    assert found and "MAGMA 2.5.4" in found[0].found


def test_compiler_too_new_for_nvcc_and_other_than_the_recipe(tmp_path: Path) -> None:
    """build.gcc = 13 makes the build run gcc-13 (the caller's CC does not count): a gcc-13 on PATH that is
    really gcc 16 is named as both other than the recipe's and newer than nvcc 13.0 accepts."""
    gcc = script(tmp_path / "fake" / "gcc-13", 'case "$1" in -dumpfullversion) echo 16.1.0;; '
                 '*) echo "gcc (GCC) 16.1.0"; echo "Free Software Foundation";; esac\n')  # fmt: skip
    plan = cu130_plan(tmp_path)
    assert (plan.env_for("torch")["CC"], plan.env_for("torch")["CUDAHOSTCXX"]) == ("gcc-13", "g++-13")
    found = [
        f
        for f in preflight.preflight(plan, {"PATH": str(gcc.parent), "CC": "/usr/bin/cc"})
        if f.check == "compiler"
    ]
    wanted = " | ".join(f.wanted for f in found)
    assert "gcc 13 (build.gcc)" in wanted and "gcc <= 15" in wanted, wanted


def test_the_interpreter_is_run_not_just_found(tmp_path: Path) -> None:
    """A pyenv shim is on PATH but cannot run the version: that is a missing Python, with its message."""
    fake = script(
        tmp_path / "shims" / "python3.12", 'echo "pyenv: python3.12: command not found" >&2; exit 127\n'
    )
    found = [
        f
        for f in preflight.preflight(cu130_plan(tmp_path), {"PATH": str(fake.parent)})
        if f.check == "python"
    ]
    assert found and "command not found" in found[0].found


def test_memory_and_disk_figures_are_stated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    small = Resources(cpus=2, memory_bytes=8 * GIB)
    plan = make_plan(load_recipe(CPU), workdir=tmp_path / "w", dist=tmp_path / "d", jobs=16, resources=small)
    monkeypatch.setitem(preflight_machine.DISK_GIB, "cpu", 10.0**9)
    found = {f.check: f for f in preflight.preflight(plan, {"PATH": ""})}
    assert "2 GiB per cpu compile job" in found["memory"].wanted and found["memory"].fix == "--jobs 3"
    assert "GiB free under" in found["disk"].found


@pytest.mark.parametrize("short", [False, True], ids=["this-disk", "a-disk-too-small"])
def test_cpu_recipe_passes_here(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, short: bool
) -> None:
    """The shipped CPU recipe, made for the Python running the tests as `recipe new` makes it, passes the
    host checks where a CPU build can run (the README's build packages installed). The disk check is the
    host's too, and a machine's free space is what it is (CI's varies by tens of GB): with DISK_GIB free under
    the work directory the check passes; with less it refuses on the disk alone, stating the free space
    (``short``: a need no disk meets, so that side is taken on every machine)."""
    require(
        shutil.which("gcc") is not None and shutil.which("ccache") is not None, "gcc and ccache are needed"
    )
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    recipe = tmp_path / "cpu.toml"
    assert main(["recipe", "new", CPU.stem, "--python", running, "--output", str(recipe)]) == 0
    capsys.readouterr()
    if short:
        monkeypatch.setitem(preflight_machine.DISK_GIB, "cpu", 10.0**6)
    need = preflight_machine.DISK_GIB["cpu"]
    before = shutil.disk_usage(tmp_path).free / 2**30
    code = main(["check", str(recipe), "--workdir", str(tmp_path / "w")])
    after = shutil.disk_usage(tmp_path).free / 2**30
    err = capsys.readouterr().err
    refused = sorted({line.split(":")[1].strip() for line in err.splitlines() if line.startswith("host: ")})
    assert refused in ([], ["disk"]), err  # nothing but the disk, whatever this machine has
    assert (code == 0) == (refused == []), err
    if min(before, after) >= need:  # (other tests write beside this one: both readings on one side)
        assert code == 0, err
    elif max(before, after) < need:
        assert code == 2 and f"GiB free under {tmp_path}" in err and f"{need:g} GiB for a cpu build" in err, (
            err
        )


def test_check_and_build_refuse_before_any_fetch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(bin_dir(tmp_path, "git")))
    work, dist = tmp_path / "w", tmp_path / "d"
    for command in ("check", "build"):
        assert main([command, str(CU130), "--workdir", str(work), "--dist", str(dist)]) == 2
        err = capsys.readouterr().err
        assert "host: python: found no python3.12 on PATH" in err and "host: magma:" in err, err
        assert "nothing was fetched or built" in err and "Traceback" not in err
    assert not work.exists() and not dist.exists()


# --------------------------------------------------------------------------------------------------------
# --source-dir trees: their version.txt against the recipe.
# --------------------------------------------------------------------------------------------------------


def vision_tree(tmp_path: Path, version: str) -> Path:
    tree = tmp_path / f"vision-{version}"
    shutil.copytree(VISION_LIKE, tree)
    (tree / "version.txt").write_text(version + "\n")
    return tree


def test_a_tree_of_the_recipes_version_passes(tmp_path: Path) -> None:
    tree = vision_tree(tmp_path, "0.28.0a0")
    assert tree_version("torchvision", tree).release is not None
    recipe = load_recipe(CPU)
    plan = make_plan(recipe, source_dirs={"torchvision": tree}, only="torchvision", resources=BIG)
    assert "source" not in checks(preflight.preflight(plan, {"PATH": ""}))


def test_a_tree_of_another_version_is_refused_or_built_as_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = vision_tree(tmp_path, "0.21.0")
    args = [
        str(CPU),
        "--only",
        "torchvision",
        "--source-dir",
        f"torchvision={tree}",
        "--workdir",
        str(tmp_path),
    ]
    assert main(["check", *args]) == 2
    err = capsys.readouterr().err
    assert "host: source:torchvision: found '0.21.0'" in err and "--accept-source-version" in err
    # Accepted explicitly, the wheel carries the tree's version, and the rules see it: 0.21 does not
    # pair with torch 2.13, which is refused as it would be in a recipe.
    assert main(["check", *args, "--accept-source-version", "torchvision"]) == 2
    err = capsys.readouterr().err
    assert "torchvision.version: torchvision 0.21.0 does not pair with torch 2.13.0" in err, err
    recipe, notes = adopt_source_versions(load_recipe(CPU), {"torchvision": tree}, frozenset({"torchvision"}))
    assert (
        str(recipe.torchvision.version) == "0.21.0" and recipe.torchvision_wheel_version == "0.21.0+cpu.kiln1"
    )
    assert notes and "0.21.0" in notes[0]


def test_an_accepted_tree_version_is_stamped_and_noted(tmp_path: Path) -> None:
    tree = tmp_path / "pytorch"
    tree.mkdir()
    (tree / "version.txt").write_text("2.13.1a0\n")
    recipe, notes = adopt_source_versions(load_recipe(CPU), {"torch": tree}, frozenset({"torch"}))
    plan = make_plan(recipe, source_dirs={"torch": tree}, only="torch", resources=BIG, notes=notes)
    assert plan.env_for("torch")["PYTORCH_BUILD_VERSION"] == "2.13.1+cpu.kiln1"
    assert plan.to_dict()["notes"] == list(notes)
    assert "source" not in checks(preflight.preflight(plan, {"PATH": ""}))


def test_accept_source_version_needs_a_source_dir(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(CPU), "--accept-source-version", "torch"]) == 2
    assert "needs --source-dir torch=PATH" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------------
# What a compile needs from the host (issue 20 item 1): the compilers the build invokes, the Python headers
# of the recipe's Python, the compiler cache's tool. Real compilers and interpreters, on PATHs made of
# symlinks to the real tools.
# --------------------------------------------------------------------------------------------------------


def this_python_recipe_plan(tmp_path: Path, **options: object) -> Plan:
    """The CPU recipe's plan for the Python this test runs on (the checks read python.version only)."""
    recipe = load_recipe(CPU)
    recipe = dataclasses.replace(recipe, python=f"{sys.version_info.major}.{sys.version_info.minor}")
    return make_plan(recipe, workdir=tmp_path / "w", dist=tmp_path / "d", resources=BIG, **options)  # type: ignore[arg-type]


def base_python() -> Path:
    """The real interpreter this venv was made from (not a pyenv shim)."""
    return Path(getattr(sys, "_base_executable", sys.executable)).resolve()


def host_tools(tmp_path: Path, *tools: str) -> dict[str, str]:
    """A PATH of the named real tools plus this test's Python as pythonX.Y (the recipe's)."""
    path = bin_dir(tmp_path, *tools)
    (path / f"python{sys.version_info.major}.{sys.version_info.minor}").symlink_to(base_python())
    return {"PATH": str(path), "HOME": str(tmp_path)}


def test_a_path_without_a_cxx_compiler_is_refused_naming_it(tmp_path: Path) -> None:
    """A host with a C compiler and no C++ one (Debian's gcc without g++): cxx names what is missing, the C
    compiler passes, and nothing else is blamed."""
    env = host_tools(tmp_path, "cc", "as", "ld", "git", "ccache")  # gcc runs as and ld from PATH
    found = preflight.preflight(this_python_recipe_plan(tmp_path), env)
    by_check = {f.check: f for f in found}
    assert "cxx" in by_check and "cc" not in by_check, [str(f) for f in found]
    assert by_check["cxx"].found == "no c++ on PATH"
    assert "apt-get install g++" in by_check["cxx"].fix
    assert "python-headers" not in by_check and "cache" not in by_check


def test_cxx_pointing_at_nothing_or_at_a_c_compiler_is_refused(tmp_path: Path) -> None:
    env = host_tools(tmp_path, "c++", "cc", "gcc", "as", "ld", "git", "ccache")
    plan = this_python_recipe_plan(tmp_path)
    [nothing] = [f for f in preflight.preflight(plan, {**env, "CXX": "/nonexistent/g++"}) if f.check == "cxx"]
    assert nothing.found == "$CXX=/nonexistent/g++, and there is no executable /nonexistent/g++"
    assert "$CXX=/nonexistent/g++" in nothing.wanted
    # gcc as the C++ compiler compiles C++ but does not link libstdc++: it runs, and cannot build.
    [c_only] = [f for f in preflight.preflight(plan, {**env, "CXX": "gcc"}) if f.check == "cxx"]
    assert c_only.found.startswith("$CXX=gcc (") and "cannot build a trivial C++ program" in c_only.found
    assert "undefined reference" in c_only.found, c_only.found
    assert not [f for f in preflight.preflight(plan, env) if f.check in ("cxx", "cc")]


def interpreter_without_headers(root: Path) -> Path:
    """A real CPython whose installation has no include/ directory, as Debian's python3.X is without
    python3.X-dev: this test's interpreter copied to ROOT/bin, its standard library linked at ROOT/lib, so
    its prefix (and ``sysconfig.get_path('include')``) is ROOT, where there are no headers."""
    real = base_python()
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (root / "bin").mkdir(parents=True)
    (root / "lib").mkdir()
    shutil.copy2(real, root / "bin" / version)
    (root / "lib" / version).symlink_to(sysconfig.get_path("stdlib"))
    libdir = Path(sysconfig.get_config_var("LIBDIR") or "/nonexistent")
    for shared in libdir.glob("libpython*.so*"):  # a shared-library build loads it from its prefix
        (root / "lib" / shared.name).symlink_to(shared)
    return root / "bin" / version


def test_an_interpreter_without_its_headers_is_refused(tmp_path: Path) -> None:
    python = interpreter_without_headers(tmp_path / "python")
    include = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('include'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert include == str(tmp_path / "python" / "include" / python.name), include
    env = host_tools(tmp_path, "c++", "cc", "as", "ld", "git", "ccache")
    env["PATH"] = f"{python.parent}{os.pathsep}{env['PATH']}"  # the recipe's pythonX.Y is this one now
    found = preflight.preflight(this_python_recipe_plan(tmp_path), env)
    by_check = {f.check: f for f in found}
    assert "python" not in by_check, [str(f) for f in found]  # it runs, with venv and ensurepip
    headers = by_check["python-headers"]
    assert headers.found == f"no Python.h in {include} (sysconfig.get_path('include') of {python})"
    # not the distribution's Python (its headers would be under /usr/include): no apt-get, a Python with them
    assert "apt" not in headers.fix and f"({python} was installed without them)" in headers.fix, headers.fix
    # The interpreter it was copied from has its headers: no finding.
    (tmp_path / "real").mkdir()
    real = host_tools(tmp_path / "real", "c++", "cc", "as", "ld")
    assert "python-headers" not in checks(preflight.preflight(this_python_recipe_plan(tmp_path), real))


def test_the_compiler_caches_tool_is_checked_unless_there_is_no_cache(tmp_path: Path) -> None:
    env = host_tools(tmp_path, "c++", "cc", "as", "ld", "git")  # no ccache
    found = {f.check: f for f in preflight.preflight(this_python_recipe_plan(tmp_path), env)}
    assert found["cache"].found == "no ccache on PATH" and "--cache none" in found["cache"].fix
    from torchkiln.cache import resolve_cache

    none = resolve_cache(load_recipe(CPU).cache, kind="none")
    assert "cache" not in checks(preflight.preflight(this_python_recipe_plan(tmp_path, cache=none), env))


def test_check_on_a_bare_host_names_every_missing_tool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newcomer's minimal root, as far as PATH goes: git only. Every missing tool, one line each."""
    monkeypatch.setenv("PATH", str(bin_dir(tmp_path, "git")))
    assert main(["check", str(CPU), "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    for line in ("host: python: found no python3.11 on PATH", "host: cxx: found no c++ on PATH",
                 "host: cc: found no cc on PATH", "host: cache: found no ccache on PATH"):  # fmt: skip
        assert line in err, err
    assert "host: compiler:" not in err  # the missing C compiler is named once, by the cc check
