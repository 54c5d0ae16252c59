"""`torchkiln reproduce` for real (issue 35 item 6): a build, then a rebuild from its record in a fresh work
directory at another path, both through the command line a user types.

tests/data/repro_project stands in for torch (``--only torch``): a C extension built by the plan's own steps
(venv, build requirements from the index, ``python -m build --wheel --no-isolation``, real gcc).

* From a signed statement, a checkout fetched from a local git repository (file://) on a branch that moves
  after the build (a real change): the rebuild fetches the recorded commit, not the branch, and every wheel
  has the recorded sha256.
* The non-reproducible control: the tree with STAMP_BUILD_TIME, whose setup.py writes the build time into
  kiln_repro/build_time.txt and into the extension's .rodata, given as a tree without git (--source-dir),
  its files' mtimes moved after the build as an extraction moves them: the rebuild fails (exit 1) naming
  build_time.txt (its line), the extension's .rodata, and nothing else but RECORD: the other members'
  zip timestamps are the recorded SOURCE_DATE_EPOCH's, not the moved mtimes'.

Both builds of both tests share one build venv through a module-scoped environment store (one venv made,
three reused). Measured on the shared 2-core machine (load 7): 60 s for the module, most of it that one
venv and the two removals of the work directories.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit import ROOT
from kit.imagekit import need

pytestmark = pytest.mark.integration

HERE = ROOT / "tests"
PROJECT = HERE / "data" / "repro_project"
RECIPE = (HERE / "data" / "ext-cpu-test.toml").read_text()
WHEEL = "kiln_repro-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"
GIT = ["git", "-c", "user.name=kiln", "-c", "user.email=kiln@example.invalid"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    for tool in ("git", "cc", "python3.11", "openssl"):
        need(tool)
    path = tmp_path_factory.mktemp("envs")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def torchkiln(store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TORCHKILN_ENV_STORE": str(store)}
    return subprocess.run(
        [sys.executable, "-m", "torchkiln", *args], env=env, capture_output=True, text=True, check=False
    )


def build(store: Path, recipe: Path, root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = ["build", str(recipe), "--only", "torch", "--no-preflight", "--skip-postcheck", "--cache", "none"]
    argv += ["--jobs", "2", "--workdir", str(root / "work"), "--dist", str(root / "dist"), *extra]
    done = torchkiln(store, *argv)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_a_fetched_checkout_reproduces_from_its_signed_provenance_at_the_recorded_commit(
    store: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(PROJECT, repo)
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    subprocess.run([*GIT, "-C", str(repo), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(repo), "commit", "-qm", "release"], check=True)
    recipe = tmp_path / "repro-test.toml"
    recipe.write_text(
        RECIPE.replace("file:///nonexistent/pytorch", f"file://{repo}").replace(
            'ref = "v2.13.0"', 'ref = "main"'
        )
    )
    key = tmp_path / "kiln.key"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True)
    public = tmp_path / "kiln.pub"
    subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(public)], check=True)
    first = tmp_path / "first"
    build(store, recipe, first, "--sign-key-file", str(key))
    manifest = json.loads((first / "dist" / "manifest.json").read_text())
    commit = manifest["sources"]["torch"]["commit"]
    # the branch moves on: a rebuild of "main" would be another wheel
    (repo / "kiln_repro" / "__init__.py").write_text('"""moved on"""\nfrom ._speed import twice\n')
    subprocess.run([*GIT, "-C", str(repo), "commit", "-qam", "moved on"], check=True)

    again = tmp_path / "again"
    statement = first / "dist" / "ext-cpu-test.intoto.jsonl"
    done = torchkiln(store, "reproduce", str(statement), "--key", str(public), "--workdir", str(again))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"same      {WHEEL}  sha256 {manifest['wheels'][0]['sha256']}" in done.stdout
    assert "reproduced: every wheel has the recorded sha256" in done.stdout
    report = json.loads((again / "reproduce.json").read_text())
    assert report["same"] and report["context"] == [] and report["signature"].startswith("signed by keyid")
    rebuilt = json.loads((again / "dist" / "manifest.json").read_text())
    assert rebuilt["sources"]["torch"]["commit"] == commit and rebuilt["sources"]["torch"]["ref"] == commit
    assert (
        rebuilt["build_env"]["torch"]["SOURCE_DATE_EPOCH"]
        == manifest["build_env"]["torch"]["SOURCE_DATE_EPOCH"]
    )
    assert str(again) in rebuilt["build_env"]["torch"]["VIRTUAL_ENV"], "rebuilt in the fresh work directory"


def test_the_non_reproducible_control_fails_naming_the_file_and_the_elf_section(
    store: Path, tmp_path: Path
) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(PROJECT, tree)
    (tree / "STAMP_BUILD_TIME").write_text("")
    recipe = tmp_path / "repro-test.toml"
    recipe.write_text(RECIPE)
    first = tmp_path / "first"
    build(store, recipe, first, "--source-dir", f"torch={tree}")
    # as an extraction would: every file newer (a tree without git takes its epoch from its newest file)
    later = time.time() + 86400
    for path in tree.rglob("*"):
        os.utime(path, (later, later))

    again = tmp_path / "again"
    done = torchkiln(store, "reproduce", str(first / "dist" / "manifest.json"), "--workdir", str(again))
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith(f"DIFFERS   {WHEEL}  recorded sha256 ") for line in lines), done.stdout
    [stamp] = [line for line in lines if line.startswith("  kiln_repro/build_time.txt: ")]
    assert stamp.startswith("  kiln_repro/build_time.txt: line 1: 'built at ")
    [module] = [line for line in lines if line.startswith("  kiln_repro/_speed.")]
    assert ".rodata (bytes)" in module and module.split(": ", 1)[1].startswith("ELF sections differ: ")
    differs = next(i for i, line in enumerate(lines) if line.startswith("DIFFERS   "))
    members = [line.split(":", 1)[0].strip() for line in lines[differs:] if line.startswith("  kiln_repro")]
    assert sorted(members) == sorted(
        [
            "kiln_repro/build_time.txt",
            "kiln_repro/_speed.cpython-311-x86_64-linux-gnu.so",
            "kiln_repro-2.13.0+cpu.dist-info/RECORD",
        ]
    ), done.stdout
    assert "NOT reproduced" in lines[-1]
    report = json.loads((again / "reproduce.json").read_text())
    assert not report["same"] and report["wheels"][0]["status"] == "differs"
