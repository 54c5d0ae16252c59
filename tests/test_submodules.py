"""A source tree without its git submodules is refused before any work, naming them (issue 19 item 5): a
``--source-dir`` tree by preflight, a fetched checkout right after its fetch steps (before the env steps).

Real trees: upstream's PyTorch 2.6.0 release source (Debian's orig tarball, which has no submodules and no
``.gitmodules``: its setup.py's own list applies), and git repositories with real submodules made here
(``file://`` URLs), populated and not.
"""

from __future__ import annotations

import dataclasses
import io
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import tomli_w
from kit import ROOT
from rich.console import Console

from torchkiln.build.loop import BuildOptions, run_build
from torchkiln.cache import resolve_cache
from torchkiln.cli import main
from torchkiln.errors import BuildFailed
from torchkiln.plan import preflight, preflight_findings
from torchkiln.plan.jobs import GIB, Resources
from torchkiln.plan.make import make_plan
from torchkiln.recipe.loader import load_recipe, parse_recipe
from torchkiln.shipped import tomllib
from torchkiln.source.submodules import missing_submodules

CPU = ROOT / "recipes" / "torch-2.13-cpu-py311.toml"
TEST_RECIPE = ROOT / "tests" / "data" / "ext-cpu-test.toml"
BIG = Resources(cpus=4, memory_bytes=64 * GIB)
ENV = {"GIT_AUTHOR_NAME": "k", "GIT_AUTHOR_EMAIL": "k@x.invalid", "GIT_COMMITTER_NAME": "k",
       "GIT_COMMITTER_EMAIL": "k@x.invalid", "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent",
       "GIT_CONFIG_NOSYSTEM": "1"}  # fmt: skip
# PyTorch 2.6.0's setup.py, get_submodule_folders(): the folders it checks when the tree has no .gitmodules.
SETUP_PY_2_6_FOLDERS = ["third_party/gloo", "third_party/cpuinfo", "third_party/onnx", "third_party/fbgemm",
                        "third_party/cutlass"]  # fmt: skip


def git(repo: Path, *args: str) -> str:
    argv = [
        "git",
        "-C",
        str(repo),
        "-c",
        "init.defaultBranch=main",
        "-c",
        "protocol.file.allow=always",
        *args,
    ]
    return subprocess.run(argv, capture_output=True, text=True, check=True, env=ENV).stdout.strip()


def new_repo(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q")
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-qm", "init")
    return path


@pytest.fixture
def upstream(tmp_path: Path) -> Path:
    """pytorch-like repository with a submodule (third_party/kiln_sub) that has one of its own (deps/inner)."""
    inner = new_repo(tmp_path / "up" / "inner", {"CMakeLists.txt": "# inner\n"})
    sub = new_repo(tmp_path / "up" / "sub", {"CMakeLists.txt": "# sub\n"})
    git(sub, "submodule", "add", "-q", f"file://{inner}", "deps/inner")
    git(sub, "commit", "-qm", "inner")
    top = new_repo(tmp_path / "up" / "pytorch", {"version.txt": "2.13.0a0\n"})
    git(top, "submodule", "add", "-q", f"file://{sub}", "third_party/kiln_sub")
    git(top, "commit", "-qm", "sub")
    return top


def source_plan(tree: Path, tmp_path: Path):  # noqa: ANN201 - a Plan
    return make_plan(
        load_recipe(CPU),
        workdir=tmp_path / "w",
        dist=tmp_path / "d",
        source_dirs={"torch": tree},
        only="torch",
        resources=BIG,
    )


def submodule_findings(tree: Path, tmp_path: Path) -> list[preflight_findings.Finding]:
    found = preflight.preflight(source_plan(tree, tmp_path), {"PATH": ""})
    return [f for f in found if f.check == "submodules:torch"]


def test_a_clone_without_its_submodules_is_refused_until_they_are_checked_out(
    upstream: Path, tmp_path: Path
) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(upstream), str(clone)], check=True, env=ENV)
    assert (clone / "third_party" / "kiln_sub").is_dir()  # git leaves the submodule's directory, empty
    [finding] = submodule_findings(clone, tmp_path)
    assert "1 submodule(s) of" in finding.found and "third_party/kiln_sub (from .gitmodules)" in finding.found
    assert "git submodule update --init --recursive" in finding.fix
    # Not recursive: the submodule is there, its own submodule is not, and is named by its full path.
    git(clone, "submodule", "update", "--init", "-q")
    [finding] = submodule_findings(clone, tmp_path)
    assert "third_party/kiln_sub/deps/inner" in finding.found, finding.found
    git(clone, "submodule", "update", "--init", "--recursive", "-q")
    assert missing_submodules(clone) is None
    assert submodule_findings(clone, tmp_path) == []


def test_the_cli_names_the_missing_submodules_and_fetches_nothing(
    upstream: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(upstream), str(clone)], check=True, env=ENV)
    work, dist = tmp_path / "w", tmp_path / "d"
    args = [str(CPU), "--only", "torch", "--source-dir", f"torch={clone}", "--workdir", str(work)]
    for command in ("check", "build"):
        assert main([command, *args, "--dist", str(dist)]) == 2
        err = capsys.readouterr().err
        assert f"host: submodules:torch: found 1 submodule(s) of {clone} absent or empty: " in err, err
        assert "third_party/kiln_sub" in err and "Traceback" not in err
    assert not work.exists() and not dist.exists()


def fetch_recipe(repo: str) -> bytes:
    doc = tomllib.loads(TEST_RECIPE.read_text())
    doc["recipe"]["name"] = "submodule-test"
    doc["torch"].update(repo=repo, ref="main")
    return tomli_w.dumps(doc).encode()


def build(tmp_path: Path, repo: Path):  # noqa: ANN201 - BuildResult
    """The whole plan of the test recipe (fetch, env, compile, ...) with torch fetched from ``repo``."""
    recipe = parse_recipe(fetch_recipe(f"file://{repo}"), "submodule-test.toml")
    plan = make_plan(
        recipe,
        workdir=tmp_path / "work",
        dist=tmp_path / "dist",
        only="torch",
        cache=resolve_cache(recipe.cache, kind="none"),
        resources=BIG,
    )
    console = Console(file=io.StringIO(), force_terminal=False)
    return run_build(plan, BuildOptions(console=console, skip_postcheck=True))


def test_a_fetched_checkout_without_a_submodule_stops_before_the_env_steps(
    upstream: Path, tmp_path: Path
) -> None:
    """A repository whose .gitmodules asks git not to check a submodule out (``update = none``): the fetch
    steps succeed, the checkout lacks it, and the build stops there, before any venv is made."""
    git(upstream, "config", "-f", ".gitmodules", "submodule.third_party/kiln_sub.update", "none")
    git(upstream, "commit", "-qam", "do not check out kiln_sub")
    with pytest.raises(BuildFailed) as info:
        build(tmp_path, upstream)
    message = str(info.value)
    assert info.value.step == "torch:fetch:submodule", message
    assert "the fetched checkout lacks its submodules: 1 submodule(s) of" in message
    assert "third_party/kiln_sub (from .gitmodules)" in message and "--source-dir torch=PATH" in message
    assert not (tmp_path / "work" / "venv").exists()
    # A rerun says it again at once (the fetch steps are unchanged), still before the env steps.
    with pytest.raises(BuildFailed, match="lacks its submodules"):
        build(tmp_path, upstream)
    assert not (tmp_path / "work" / "venv").exists()


def test_a_fetched_checkout_with_its_submodules_goes_on(upstream: Path, tmp_path: Path) -> None:
    """Populated by the fetch's own ``submodule update --init --recursive``: the check passes (the fetch
    steps of the same plan, then publish)."""
    recipe = parse_recipe(fetch_recipe(f"file://{upstream}"), "submodule-test.toml")
    plan = make_plan(
        recipe,
        workdir=tmp_path / "work",
        dist=tmp_path / "dist",
        only="torch",
        cache=resolve_cache(recipe.cache, kind="none"),
        resources=BIG,
    )
    plan = dataclasses.replace(plan, steps=[s for s in plan.steps if s.kind in ("fetch", "publish")])
    console = Console(file=io.StringIO(), force_terminal=False)
    result = run_build(plan, BuildOptions(console=console, skip_postcheck=True))
    assert "torch:fetch:submodule" in result.ran
    checkout = tmp_path / "work" / "src" / "pytorch"
    assert (checkout / "third_party" / "kiln_sub" / "deps" / "inner" / "CMakeLists.txt").is_file()


@pytest.mark.integration
def test_upstreams_pytorch_2_6_release_tree_is_refused_naming_its_submodules(
    pytorch_2_6_tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real 2.6.0 release source has no submodules and no .gitmodules; its setup.py names the folders
    it checks then, and so does preflight, before anything is fetched or built."""
    assert not (pytorch_2_6_tree / ".gitmodules").exists()
    missing = missing_submodules(pytorch_2_6_tree)
    assert missing is not None and list(missing.paths) == SETUP_PY_2_6_FOLDERS
    assert "setup.py get_submodule_folders(); the tree has no .gitmodules" in missing.found()
    work = tmp_path / "w"
    args = [str(CPU), "--only", "torch", "--source-dir", f"torch={pytorch_2_6_tree}", "--workdir", str(work)]
    assert main(["check", *args]) == 2
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("host: submodules:torch: "))
    assert ", ".join(SETUP_PY_2_6_FOLDERS) in line and "git submodule update --init --recursive" in line
    assert "Traceback" not in err and not work.exists()
    # With the submodules' directories there (as a complete archive has them) the check passes.
    tree = tmp_path / "pytorch"
    shutil.copytree(pytorch_2_6_tree / "third_party", tree / "third_party", symlinks=True)
    shutil.copy(pytorch_2_6_tree / "setup.py", tree / "setup.py")
    for folder in SETUP_PY_2_6_FOLDERS:
        (tree / folder).mkdir()
        (tree / folder / "CMakeLists.txt").write_text("# stands for the submodule's files\n")
    assert missing_submodules(tree) is None
