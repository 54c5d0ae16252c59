"""Fetching pinned sources with real git from local repositories served by file:// URLs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from packaging.version import Version

from torchkiln.artifacts.lockfile import LOCK_FORMAT, load_lock, write_lock
from torchkiln.build.fingerprint import tree_sha256
from torchkiln.errors import DocumentError, TorchkilnError
from torchkiln.recipe.model import SourceSpec
from torchkiln.source.git import check_pin, fetch_commands, is_git_checkout, lock_source

GIT_ENV_KEYS = {
    "GIT_AUTHOR_NAME": "kiln",
    "GIT_AUTHOR_EMAIL": "kiln@example.invalid",
    "GIT_COMMITTER_NAME": "kiln",
    "GIT_COMMITTER_EMAIL": "kiln@example.invalid",
}


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "protocol.file.allow=always", "-c", "init.defaultBranch=main", *args],
        capture_output=True,
        text=True,
        check=True,
        env={**GIT_ENV_KEYS, "PATH": "/usr/bin:/bin", "HOME": str(repo)},
    )
    return done.stdout.strip()


def commit_file(repo: Path, name: str, text: str) -> str:
    (repo / name).write_text(text)
    git(repo, "add", name)
    git(repo, "commit", "--quiet", "-m", f"change {name}")
    return git(repo, "rev-parse", "HEAD")


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "--quiet")
    return path


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A 'torch' repo with history, a tag, a submodule that has its own nested submodule."""
    root = tmp_path_factory.mktemp("upstream")
    leaf = make_repo(root / "leaf")
    leaf_sha = commit_file(leaf, "leaf.txt", "leaf v1\n")
    dep = make_repo(root / "dep")
    commit_file(dep, "dep.txt", "dep v1\n")
    git(dep, "submodule", "add", "--quiet", f"file://{leaf}", "nested/leaf")
    git(dep, "commit", "--quiet", "-m", "add leaf")
    dep_sha = git(dep, "rev-parse", "HEAD")
    commit_file(dep, "dep.txt", "dep v2 (not what torch pins)\n")
    torch = make_repo(root / "torch")
    commit_file(torch, "a.txt", "one\n")
    commit_file(torch, "a.txt", "two\n")
    git(torch, "submodule", "add", "--quiet", f"file://{dep}", "third_party/dep")
    git(torch, "-C", "third_party/dep", "checkout", "--quiet", dep_sha)
    git(torch, "-C", "third_party/dep", "submodule", "update", "--init", "--quiet")
    git(torch, "add", "third_party/dep")
    git(torch, "commit", "--quiet", "-m", "pin dep")
    v1 = git(torch, "rev-parse", "HEAD")
    git(torch, "tag", "v1.0.0")
    v2 = commit_file(torch, "a.txt", "three\n")
    return {"torch": torch, "dep_sha": dep_sha, "leaf_sha": leaf_sha, "v1": v1, "v2": v2}


def fetch(spec: SourceSpec, dest: Path) -> None:
    for argv in fetch_commands(spec, dest, jobs=2):
        subprocess.run(argv, check=True, capture_output=True, env={**GIT_ENV_KEYS, "PATH": "/usr/bin:/bin"})


def spec(upstream: dict[str, object], ref: str, commit: str | None = None) -> SourceSpec:
    return SourceSpec("torch", f"file://{upstream['torch']}", ref, Version("1.0.0"), commit)


def test_shallow_fetch_of_a_tag_with_recursive_submodules(upstream, tmp_path: Path) -> None:
    dest = tmp_path / "src"
    fetch(spec(upstream, "v1.0.0"), dest)
    assert git(dest, "rev-parse", "HEAD") == upstream["v1"]
    assert git(dest, "rev-parse", "--is-shallow-repository") == "true"
    assert git(dest, "rev-list", "--count", "HEAD") == "1"
    assert (dest / "a.txt").read_text() == "two\n"
    # the submodule is at the commit the superproject records, not the tip of its branch
    assert (dest / "third_party/dep/dep.txt").read_text() == "dep v1\n"
    assert (dest / "third_party/dep/nested/leaf/leaf.txt").read_text() == "leaf v1\n"
    assert git(dest / "third_party/dep", "rev-parse", "--is-shallow-repository") == "true"


def test_pin_match_and_lock_file(upstream, tmp_path: Path) -> None:
    dest = tmp_path / "src"
    pinned = spec(upstream, "v1.0.0", str(upstream["v1"]))
    fetch(pinned, dest)
    assert check_pin(pinned, dest) == upstream["v1"]
    lock = lock_source("torch", dest, repo=pinned.repo, ref=pinned.ref, provided=False)
    out = tmp_path / "dist" / "r.lock.json"
    write_lock(out, "r", "ab" * 32, [lock])
    doc = json.loads(out.read_text())
    entry = doc["sources"]["torch"]
    assert doc["recipe"] == "r" and doc["recipe_sha256"] == "ab" * 32
    assert entry["commit"] == upstream["v1"] and entry["ref"] == "v1.0.0" and entry["dirty"] is False
    subs = {s["path"]: s for s in entry["submodules"]}
    assert set(subs) == {"third_party/dep", "third_party/dep/nested/leaf"}
    assert subs["third_party/dep"]["commit"] == upstream["dep_sha"]
    assert subs["third_party/dep/nested/leaf"]["commit"] == upstream["leaf_sha"]
    assert all(s["state"] == "ok" for s in subs.values())
    assert subs["third_party/dep"]["url"].startswith("file://")
    assert [p.name for p in out.parent.iterdir()] == ["r.lock.json"]  # no temp file left
    loaded = load_lock(out)
    assert loaded.format == LOCK_FORMAT and loaded.sources["torch"] == lock, "the typed document round-trips"


def test_lock_loader_names_the_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "r.lock.json"
    with pytest.raises(DocumentError, match=r"r.lock.json: <file>: no such file"):
        load_lock(path)
    path.write_text("{not json")
    with pytest.raises(DocumentError, match=r"r.lock.json: <document>: invalid JSON"):
        load_lock(path)
    path.write_text(json.dumps({"format": 1, "recipe": "r", "recipe_sha256": "x", "sources": {}}))
    with pytest.raises(DocumentError, match=r"r.lock.json: format: lock file format 1 is not the one"):
        load_lock(path)
    doc = {
        "format": LOCK_FORMAT,
        "recipe": "r",
        "recipe_sha256": "x",
        "sources": {"torch": {"name": "torch"}},
    }
    path.write_text(json.dumps(doc))
    with pytest.raises(DocumentError) as info:
        load_lock(path)
    lines = str(info.value).splitlines()
    assert f"{path}: sources.torch.commit: missing (valid: a string or null)" in lines
    assert f"{path}: sources.torch.dirty: missing (valid: a boolean)" in lines
    doc["sources"]["torch"] = {"name": "torch", "repo": None, "ref": None, "commit": 7, "dirty": "yes",
                               "provided": False, "path": "/src"}  # fmt: skip
    path.write_text(json.dumps(doc))
    with pytest.raises(DocumentError) as info:
        load_lock(path)
    assert str(info.value).splitlines() == [
        f"{path}: sources.torch.commit: expected a string, got an integer",
        f"{path}: sources.torch.dirty: expected a boolean, got a string",
    ]


def test_pin_mismatch_is_refused_with_both_shas(upstream, tmp_path: Path) -> None:
    dest = tmp_path / "src"
    # the branch moved on to v2 while the recipe still pins v1
    pinned = spec(upstream, "main", str(upstream["v1"]))
    fetch(pinned, dest)
    with pytest.raises(TorchkilnError) as info:
        check_pin(pinned, dest)
    message = str(info.value)
    assert str(upstream["v2"]) in message and str(upstream["v1"]) in message
    assert "torch.commit" in message


def test_unknown_ref_fails_in_git_not_silently(upstream, tmp_path: Path) -> None:
    argvs = fetch_commands(spec(upstream, "v9.9.9"), tmp_path / "src")
    subprocess.run(argvs[0], check=True, capture_output=True)
    subprocess.run(argvs[1], check=True, capture_output=True)
    done = subprocess.run(argvs[2], capture_output=True, text=True)
    assert done.returncode != 0 and "v9.9.9" in done.stderr


def test_fetch_commands_never_splice_recipe_strings() -> None:
    hostile = SourceSpec("torch", "https://example.invalid/x.git", "v1;rm -rf ~", Version("1.0.0"))
    argvs = fetch_commands(hostile, Path("/tmp/x y"))
    assert (
        "git",
        "-C",
        "/tmp/x y",
        "fetch",
        "--depth",
        "1",
        "--no-tags",
        "--",
        "origin",
        "v1;rm -rf ~",
    ) in argvs
    # remote (non-local) repositories keep git's default refusal of file:// submodules
    assert not any("protocol.file.allow=always" in a for argv in argvs for a in argv)


def test_lock_of_a_provided_tree_that_is_not_git(tmp_path: Path) -> None:
    """No commit names such a tree, so the lock names its contents."""
    (tmp_path / "setup.py").write_text("")
    lock = lock_source("torch", tmp_path, repo=None, ref=None, provided=True)
    assert lock.commit is None and lock.provided and lock.submodules == []
    assert lock.tree_sha256 == tree_sha256(tmp_path) and len(lock.tree_sha256) == 64
    given = lock_source("torch", tmp_path, repo=None, ref=None, provided=True, tree_digest="ab" * 32)
    assert given.tree_sha256 == "ab" * 32, "the hash the build took before compiling wins"


def test_a_failing_git_is_an_error_not_an_empty_answer(upstream, tmp_path: Path) -> None:
    from torchkiln.build.fingerprint import tree_identity

    dest = tmp_path / "src"
    fetch(spec(upstream, "v1.0.0"), dest)
    assert is_git_checkout(dest) and not is_git_checkout(dest / "third_party")
    (dest / ".git" / "HEAD").write_text("ref: refs/heads/nowhere\n")  # HEAD names no commit
    with pytest.raises(TorchkilnError, match=r"git rev-parse HEAD in .* failed"):
        tree_identity(dest)


def test_lock_marks_a_dirty_provided_checkout(upstream, tmp_path: Path) -> None:
    dest = tmp_path / "src"
    fetch(spec(upstream, "v1.0.0"), dest)
    (dest / "a.txt").write_text("patched\n")
    lock = lock_source("torch", dest, repo=None, ref=None, provided=True)
    assert lock.dirty and lock.commit == upstream["v1"] and lock.tree_sha256 is None
