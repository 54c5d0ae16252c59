"""The pieces of the build that need no compile: atomic publishing, step state, tree identity."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from kit import ROOT
from kit.imagekit import require

from torchkiln.artifacts.published import PARTIAL_MARK, clean_partials, publish
from torchkiln.build.fingerprint import State, file_sha256, step_fingerprint, tree_identity, tree_sha256


def test_publish_replaces_atomically_and_leaves_no_temporary(tmp_path: Path) -> None:
    house, dist = tmp_path / "wheelhouse", tmp_path / "dist"
    house.mkdir()
    wheel = house / "x-1.0-py3-none-any.whl"
    wheel.write_bytes(b"new wheel")
    dist.mkdir()
    (dist / wheel.name).write_bytes(b"old wheel")
    old_inode = (dist / wheel.name).stat().st_ino
    publish(wheel, dist)
    assert (dist / wheel.name).read_bytes() == b"new wheel"
    assert (dist / wheel.name).stat().st_ino != old_inode, "replaced by rename, not rewritten in place"
    assert os.listdir(dist) == [wheel.name]
    wheel.write_bytes(b"rebuilt in the wheelhouse")  # a later build must not reach into dist/
    assert (dist / wheel.name).read_bytes() == b"new wheel"
    assert file_sha256(dist / wheel.name) != file_sha256(wheel)


def test_publish_failure_leaves_no_partial(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    with pytest.raises(FileNotFoundError):
        publish(tmp_path / "missing.whl", dist)
    assert list(dist.iterdir()) == []


def test_clean_partials_removes_only_temporaries(tmp_path: Path) -> None:
    (tmp_path / f"{PARTIAL_MARK}123-torch.whl").write_bytes(b"half")
    (tmp_path / "torch-2.13.0-cp311-cp311-linux_x86_64.whl").write_bytes(b"whole")
    removed = clean_partials(tmp_path)
    assert [p.name for p in removed] == [f"{PARTIAL_MARK}123-torch.whl"]
    assert [p.name for p in tmp_path.iterdir()] == ["torch-2.13.0-cp311-cp311-linux_x86_64.whl"]
    assert clean_partials(tmp_path / "absent") == []


def test_state_survives_reload_and_forget(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    state = State(path)
    state.record("torch:wheel", {"fingerprint": "abc"})
    state.record("build-env:venv", {"fingerprint": "def"})
    state.forget("torch:wheel")
    again = State(path)
    assert again.get("torch:wheel") is None and again.get("build-env:venv") == {"fingerprint": "def"}
    path.write_text("{not json")
    assert State(path).steps == {}, "a damaged state file means: run everything"


def test_fingerprint_reacts_to_env_argv_and_dependencies() -> None:
    base = step_fingerprint(["python", "-m", "build"], {"USE_CUDA": "1"}, "/src", {"tree": "t"}, ["d"])
    assert base == step_fingerprint(
        ["python", "-m", "build"], {"USE_CUDA": "1"}, "/src", {"tree": "t"}, ["d"]
    )
    assert base != step_fingerprint(
        ["python", "-m", "build"], {"USE_CUDA": "0"}, "/src", {"tree": "t"}, ["d"]
    )
    assert base != step_fingerprint(
        ["python", "-m", "build", "-x"], {"USE_CUDA": "1"}, "/src", {"tree": "t"}, ["d"]
    )
    assert base != step_fingerprint(
        ["python", "-m", "build"], {"USE_CUDA": "1"}, "/src", {"tree": "u"}, ["d"]
    )
    assert base != step_fingerprint(
        ["python", "-m", "build"], {"USE_CUDA": "1"}, "/src", {"tree": "t"}, ["e"]
    )


def test_tree_identity_ignores_build_outputs_but_not_sources(tmp_path: Path) -> None:
    """The build's own outputs are left out by name, as the build recorded them (issue 35: a build/ or
    *.egg-info directory the build did not write is part of the tree, as upstream's tools/build/ is)."""
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "a.cpp").write_text("int a;\n")
    first = tree_identity(tmp_path)
    (tmp_path / "build" / "temp").mkdir(parents=True)
    (tmp_path / "build" / "temp" / "a.o").write_bytes(b"obj")
    (tmp_path / "x.egg-info").mkdir()
    (tmp_path / "x.egg-info" / "PKG-INFO").write_text("Name: x\n")
    assert tree_identity(tmp_path) != first, "files nobody recorded as the build's are the tree's"
    own = ["build/temp/a.o", "x.egg-info/PKG-INFO"]
    assert tree_identity(tmp_path, own) == first
    (tmp_path / "csrc" / "a.cpp").write_text("int a = 1;\n")
    assert tree_identity(tmp_path, own) != first


def test_tree_sha256_names_contents_not_timestamps(tmp_path: Path) -> None:
    """A tree without a commit is recorded by its contents: the same bytes give the same hash, whatever
    their mtimes; a changed byte, name or executable bit changes it; the build's own outputs, named, do not;
    a build/ nobody recorded does (it is built from)."""
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "a.cpp").write_text("int a;\n")
    first = tree_sha256(tmp_path)
    os.utime(tmp_path / "csrc" / "a.cpp", (1, 1))
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "a.o").write_bytes(b"obj")
    assert tree_sha256(tmp_path, ["build/a.o"]) == first
    assert tree_sha256(tmp_path) != first
    (tmp_path / "build" / "a.o").unlink()
    assert tree_sha256(tmp_path) == first
    (tmp_path / "csrc" / "a.cpp").chmod(0o755)
    assert tree_sha256(tmp_path) != first, "the executable bit is part of the tree"
    (tmp_path / "csrc" / "a.cpp").chmod(0o644)
    assert tree_sha256(tmp_path) == first
    (tmp_path / "csrc" / "a.cpp").write_text("int b;\n")
    assert tree_sha256(tmp_path) != first
    (tmp_path / "csrc" / "a.cpp").write_text("int a;\n")
    (tmp_path / "csrc" / "a.cpp").rename(tmp_path / "csrc" / "b.cpp")
    assert tree_sha256(tmp_path) != first


def test_tree_identity_of_a_git_checkout_sees_uncommitted_edits(tmp_path: Path) -> None:
    env = {"GIT_AUTHOR_NAME": "k", "GIT_AUTHOR_EMAIL": "k@x.invalid", "GIT_COMMITTER_NAME": "k",
           "GIT_COMMITTER_EMAIL": "k@x.invalid", "PATH": os.environ["PATH"], "HOME": str(tmp_path)}  # fmt: skip
    (tmp_path / "a.cpp").write_text("int a;\n")
    for argv in (["init", "-q"], ["add", "a.cpp"], ["commit", "-qm", "a"]):
        subprocess.run(["git", "-C", str(tmp_path), *argv], check=True, env=env)
    clean = tree_identity(tmp_path)
    (tmp_path / "a.cpp").write_text("int a = 2;\n")
    patched = tree_identity(tmp_path)
    assert patched != clean
    (tmp_path / "a.cpp").write_text("int a;\n")
    assert tree_identity(tmp_path) == clean


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([], "a recipe is required"),
        (
            ["recipes/torch-2.13-cpu-py311.toml", "--source-dir", "torch=/nonexistent/src"],
            "is not a directory",
        ),
        (["recipes/torch-2.13-cpu-py311.toml", "--source-dir", "caffe=/tmp"], "unknown project"),
        (["recipes/torch-2.13-cpu-py311.toml", "--min-cache-hit-rate", "90"], "outside 0..1"),
        (["recipes/torch-2.13-cpu-py311.toml", "--only", "torchaudio"], "invalid choice"),
        (["/nonexistent/recipe.toml"], "no such file"),
    ],
)
def test_build_cli_refuses_bad_input_without_traceback(
    args, needle, capsys, monkeypatch, tmp_path: Path
) -> None:
    from torchkiln.cli import main

    root = ROOT
    monkeypatch.chdir(root)
    try:
        code = main(["build", *args, "--workdir", str(tmp_path / "w"), "--dist", str(tmp_path / "d")])
    except SystemExit as exc:  # argparse errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "Traceback" not in err
    assert not (tmp_path / "d").exists()


def test_toolchain_versions_come_from_the_tools_on_the_build_path(tmp_path: Path) -> None:
    import shutil

    from torchkiln.host.toolchain import collect, cudnn_version, probe, tool_version

    env = {"PATH": os.environ["PATH"]}
    require(shutil.which("c++") is not None, "no C++ compiler")
    dumped = subprocess.run(
        ["c++", "-dumpfullversion"], capture_output=True, text=True, check=True
    ).stdout.strip()
    found = collect(env, tmp_path / "no-venv" / "python", cuda=False, cache_tool=None)
    assert found.tools["g++"].version == dumped, "the compiler's own version, not its package's (12.2.0-14)"
    assert found.tools["g++"].command == "c++"
    assert "nvcc" not in found.tools and "ccache" not in found.tools and "sccache" not in found.tools, (
        "a CPU build without a compiler cache used neither"
    )
    with_cxx = collect({**env, "CXX": "g++"}, tmp_path / "x", cuda=False, cache_tool="ccache")
    assert with_cxx.tools["g++"].command == "$CXX=g++" and with_cxx.compilers == {"CXX": "g++"}
    if shutil.which("ccache"):
        assert with_cxx.tools["ccache"].version and with_cxx.tools["ccache"].version[0].isdigit()
    nvcc = Path("/usr/local/cuda-13.0/bin/nvcc")
    if nvcc.is_file():
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=True).stdout
        tool = probe("nvcc", str(nvcc), env, str(nvcc))
        assert tool.version and tool.version in out and tool.version.count(".") == 2
        cuda = collect({**env, "CUDACXX": str(nvcc)}, tmp_path / "x", cuda=True, cache_tool=None)
        assert cuda.tools["nvcc"].version == tool.version
    assert tool_version("ninja", {"PATH": str(tmp_path)}) is None, "not on the build's PATH: not recorded"
    liar = tmp_path / "bin" / "cmake"
    liar.parent.mkdir()
    liar.write_text("#!/bin/sh\necho 'no version here'\n")
    liar.chmod(0o755)
    broken = tool_version("cmake", {"PATH": str(liar.parent)})
    assert broken is not None and broken.version is None and "no version" in (broken.error or "")
    include = tmp_path / "include"
    include.mkdir()
    (include / "cudnn_version.h").write_text(
        "#define CUDNN_MAJOR 9\n#define CUDNN_MINOR 20\n#define CUDNN_PATCHLEVEL 0\n"
    )
    assert cudnn_version(str(tmp_path)) == "9.20.0"
    assert cudnn_version(None) is None


def test_superseded_wheels_of_the_same_project_are_removed(tmp_path: Path) -> None:
    from torchkiln.artifacts.published import remove_superseded

    names = [
        "torch-2.13.0+cpu.kiln1-cp311-cp311-linux_x86_64.whl",  # the previous build
        "torch-2.13.0+cpu.kiln2-cp311-cp311-linux_x86_64.whl",  # this build
        "torchvision-0.28.0+cpu.kiln1-cp311-cp311-linux_x86_64.whl",  # not rebuilt now: stays
        "numpy-2.1.0-cp311-cp311-linux_x86_64.whl",  # someone else's: stays
        "notes.txt",
    ]
    for name in names:
        (tmp_path / name).write_text(name)
    removed = remove_superseded(tmp_path, [tmp_path / names[1]])
    assert [p.name for p in removed] == [names[0]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[1:])


def test_files_the_build_writes_into_the_tree_leave_its_identity(tmp_path: Path) -> None:
    from torchkiln.build.fingerprint import snapshot_identity, tree_snapshot, written_by_build

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "ops.cpp").write_text("int f();\n")
    (tmp_path / "pkg" / "version.py").write_text("__version__ = '1'\n")
    before = tree_snapshot(tmp_path)
    time.sleep(0.01)
    (tmp_path / "pkg" / "version.py").write_text("__version__ = '1'\ngit_version = 'Unknown'\n")
    (tmp_path / "pkg" / "generated.h").write_text("#define X 1\n")
    written = written_by_build(before, tree_snapshot(tmp_path))
    assert written == ["pkg/generated.h", "pkg/version.py"]
    settled = snapshot_identity(before, written)
    assert tree_identity(tmp_path, written) == settled, "the next run sees the tree as it was"
    (tmp_path / "pkg" / "ops.cpp").write_text("int f();\nint g();\n")
    assert tree_identity(tmp_path, written) != settled, "an edited source still counts"


def test_a_tree_outside_the_cache_basedir_or_a_changed_compiler_is_named_as_a_miss_cause(
    tmp_path: Path,
) -> None:
    import io

    from rich.console import Console

    from torchkiln.build.compilekind import _miss_causes
    from torchkiln.build.context import BuildSetup, Options
    from torchkiln.build.display import Display
    from torchkiln.cache import resolve_cache
    from torchkiln.plan.make import make_plan
    from torchkiln.recipe.loader import load_recipe

    recipe = load_recipe(Path(__file__).parent / "data" / "ext-cpu-test.toml")
    cache = resolve_cache(recipe.cache, kind="ccache", dir=tmp_path / "cc")
    # the work directory and the tree share no directory but the root: the basedir is the work directory
    plan = make_plan(
        recipe,
        workdir=tmp_path / "work",
        source_dirs={"torch": Path("/srv/kiln-tree")},
        only="torch",
        cache=cache,
    )
    display = Display(Console(file=io.StringIO()))
    ctx = BuildSetup.make(plan, Options(), {}, State(tmp_path / "s.json"), display)
    step = next(s for s in plan.steps if s.kind == "compile")
    before = {"g++": "12.2.0"}
    after = {"tools": {"g++": {"version": "13.1.0"}, "ninja": {"version": "1.11"}}}
    causes = _miss_causes(step, ctx, before, after)
    assert causes[0].startswith("paths differ between builders: the source tree /srv/kiln-tree is outside")
    assert causes[-1] == "compiler changed: g++ 12.2.0 built this step last time, now 13.1.0"
    assert len(causes) == 2, "the build venv is under the basedir (the work directory)"
