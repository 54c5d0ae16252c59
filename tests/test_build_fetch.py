"""The fetch part of a build, through the real plan and builder (fetch steps only: nothing compiles)."""

from __future__ import annotations

import io
import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import tomli_w
from kit import ROOT
from kit.imagekit import unisolated_signing_allowed
from rich.console import Console

from torchkiln.build.loop import BuildOptions, run_build
from torchkiln.cache import resolve_cache
from torchkiln.plan.make import make_plan
from torchkiln.recipe.loader import parse_recipe
from torchkiln.shipped import tomllib

ENV = {"GIT_AUTHOR_NAME": "k", "GIT_AUTHOR_EMAIL": "k@x.invalid", "GIT_COMMITTER_NAME": "k",
       "GIT_COMMITTER_EMAIL": "k@x.invalid", "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent"}  # fmt: skip

TEST_RECIPE = ROOT / "tests" / "data" / "ext-cpu-test.toml"


def fetch_recipe_text(repo: str, ref: str) -> str:
    """The shared test recipe with torch pointed at a local repository and ref."""
    doc = tomllib.loads(TEST_RECIPE.read_text())
    doc["recipe"]["name"] = "fetch-test"
    doc["torch"].update(repo=repo, ref=ref)
    return tomli_w.dumps(doc)


def git(repo: Path, *args: str) -> str:
    argv = ["git", "-C", str(repo), "-c", "init.defaultBranch=main", *args]
    return subprocess.run(argv, capture_output=True, text=True, check=True, env=ENV).stdout.strip()


@pytest.fixture
def upstream(tmp_path: Path) -> dict[str, object]:
    repo = tmp_path / "up" / "pytorch"
    repo.mkdir(parents=True)
    git(repo, "init", "-q")
    shas = {}
    for tag in ("v1", "v2"):
        (repo / "VERSION").write_text(tag)
        git(repo, "add", "VERSION")
        git(repo, "commit", "-qm", tag)
        git(repo, "tag", tag)
        shas[tag] = git(repo, "rev-parse", "HEAD")
    mirror = tmp_path / "up" / "mirror"
    subprocess.run(["git", "clone", "-q", "--mirror", str(repo), str(mirror)], check=True, env=ENV)
    return {"repo": repo, "mirror": mirror, **shas}


def fetch(tmp_path: Path, repo: str, ref: str):
    recipe = parse_recipe(fetch_recipe_text(repo, ref).encode(), "fetch-test.toml")
    cache = resolve_cache(recipe.cache, kind="none")
    plan = make_plan(recipe, workdir=tmp_path / "work", dist=tmp_path / "dist", only="torch", cache=cache)
    plan = replace(plan, steps=[s for s in plan.steps if s.kind in ("fetch", "publish")])
    console = Console(file=io.StringIO(), force_terminal=False)
    result = run_build(plan, BuildOptions(console=console, skip_postcheck=True))
    lock = json.loads((tmp_path / "dist" / "fetch-test.lock.json").read_text())["sources"]["torch"]
    return result, lock


def test_refetch_on_changed_ref_and_url_skip_when_unchanged(upstream, tmp_path: Path) -> None:
    url = f"file://{upstream['repo']}"
    first, lock = fetch(tmp_path, url, "v1")
    assert len(first.ran) == 5 and lock["commit"] == upstream["v1"]
    again, lock = fetch(tmp_path, url, "v1")
    assert again.ran == [] and lock["commit"] == upstream["v1"]
    moved, lock = fetch(tmp_path, url, "v2")
    assert len(moved.ran) == 5 and lock["commit"] == upstream["v2"] and lock["ref"] == "v2"
    # another URL for the same project: a fresh checkout, not `git remote add` on the old one
    mirrored, lock = fetch(tmp_path, f"file://{upstream['mirror']}", "v2")
    assert len(mirrored.ran) == 5 and lock["repo"] == f"file://{upstream['mirror']}"
    checkout = tmp_path / "work" / "src" / "pytorch"
    assert git(checkout, "remote", "get-url", "origin") == f"file://{upstream['mirror']}"
    assert (checkout / "VERSION").read_text() == "v2"


def test_interrupted_fetch_resumes_without_starting_over(upstream, tmp_path: Path) -> None:
    url = f"file://{upstream['repo']}"
    fetch(tmp_path, url, "v1")
    state_path = tmp_path / "work" / "state.json"
    state = json.loads(state_path.read_text())
    for name in ("torch:fetch:checkout", "torch:fetch:submodule"):  # as if stopped during the checkout
        del state["steps"][name]
    state_path.write_text(json.dumps(state))
    resumed, lock = fetch(tmp_path, url, "v1")
    assert resumed.ran == ["torch:fetch:checkout", "torch:fetch:submodule"]
    assert lock["commit"] == upstream["v1"]


def test_a_second_build_in_the_same_workdir_is_refused(upstream, tmp_path: Path) -> None:
    import fcntl

    from torchkiln.errors import TorchkilnError

    work = tmp_path / "work"
    work.mkdir()
    with (work / "build.lock").open("a+") as held:  # as a running build holds it
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        held.write("pid 4242\n")
        held.flush()
        with pytest.raises(TorchkilnError, match=r"another torchkiln build is running in .*\(pid 4242\)"):
            fetch(tmp_path, f"file://{upstream['repo']}", "v1")
    assert not (work / "src").exists()
    _, lock = fetch(tmp_path, f"file://{upstream['repo']}", "v1")  # released: the build runs
    assert lock["commit"] == upstream["v1"]


def test_an_unreachable_remote_names_the_ways_out(tmp_path: Path) -> None:
    """Issue 11: a fetch that cannot reach its remote says what to do instead (a mirror, --source-dir)."""
    from torchkiln.errors import BuildFailed

    with pytest.raises(BuildFailed) as info:
        fetch(tmp_path, f"file://{tmp_path}/no-such-remote", "v1")
    text = str(info.value)
    assert "ways out:" in text and "torch.repo" in text and "--source-dir torch=PATH" in text


# --------------------------------------------------------------------------------------------------
# Issue 27 item 4: a fetched checkout changed after its fetch is not published silently (as cargo publish
# refuses a dirty tree). Real git, local repositories.
# --------------------------------------------------------------------------------------------------


def fetch_publish(work: Path, dist: Path, url: str, *, allow_dirty: bool = False, extra=(), sign_key=None):
    """The real plan's fetch steps and publish (``extra`` steps before publish); (result, what it printed)."""
    recipe = parse_recipe(fetch_recipe_text(url, "v1").encode(), "fetch-test.toml")
    plan = make_plan(
        recipe, workdir=work, dist=dist, only="torch", cache=resolve_cache(recipe.cache, kind="none")
    )
    steps = [s for s in plan.steps if s.kind == "fetch"] + list(extra) + [plan.steps[-1]]
    out = io.StringIO()
    options = BuildOptions(
        console=Console(file=out, width=400),
        skip_postcheck=True,
        allow_dirty=allow_dirty,
        sign_key=sign_key,
        allow_unisolated=sign_key is not None and unisolated_signing_allowed(),
    )
    return run_build(replace(plan, steps=steps), options), out.getvalue()


def dist_bytes(dist: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dist.iterdir())}


def test_a_checkout_changed_after_the_fetch_is_refused_naming_the_changed_files(
    upstream, tmp_path: Path
) -> None:
    from torchkiln.errors import BuildFailed

    work, dist = tmp_path / "work", tmp_path / "dist"
    url = f"file://{upstream['repo']}"
    fetch_publish(work, dist, url)
    before = dist_bytes(dist)
    checkout = work / "src" / "pytorch"
    (checkout / "VERSION").write_text("edited by hand\n")
    with pytest.raises(BuildFailed) as refused:
        fetch_publish(work, dist, url)
    message = str(refused.value)
    assert message.startswith(f"torch: the fetched checkout {checkout} differs from v1 of {url}: ")
    assert "1 path(s) differ from the commit: modified VERSION (content); nothing was built" in message
    assert "--allow-dirty" in message and "--source-dir torch=PATH" in message
    assert dist_bytes(dist) == before, "nothing was published"
    git(checkout, "checkout", "--", ".")
    again, _ = fetch_publish(work, dist, url)
    assert (
        again.ran == []
        and json.loads((dist / "manifest.json").read_text())["sources"]["torch"]["dirty"] is False
    )


def test_allow_dirty_publishes_with_a_warning_the_manifest_and_provenance_record(
    upstream, tmp_path: Path
) -> None:
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from torchkiln.artifacts.signing import load_envelope

    work, dist = tmp_path / "work", tmp_path / "dist"
    url = f"file://{upstream['repo']}"
    fetch_publish(work, dist, url)
    (work / "src" / "pytorch" / "VERSION").write_text("edited by hand\n")
    key = ed25519.Ed25519PrivateKey.generate()
    result, said = fetch_publish(work, dist, url, allow_dirty=True, sign_key=key)
    warning = (
        f"--allow-dirty: torch was built from {work / 'src' / 'pytorch'}, which differs from v1 of {url}"
    )
    assert warning in said
    manifest = json.loads(result.manifest.read_text())
    assert manifest["sources"]["torch"]["dirty"] is True and manifest["sources"]["torch"]["changed"] == [
        "VERSION"
    ]
    assert any(w.startswith(warning) for w in manifest["warnings"])
    assert result.provenance is not None
    statement = json.loads(load_envelope(result.provenance).payload)
    build = statement["predicate"]["buildDefinition"]
    assert build["externalParameters"]["options"]["allow_dirty"] is True
    torch = next(d for d in build["resolvedDependencies"] if d["name"] == "torch")
    assert torch["annotations"]["dirty"] is True and torch["annotations"]["changed"] == ["VERSION"]


def test_a_checkout_changed_during_the_build_is_not_published(upstream, tmp_path: Path) -> None:
    """Changed after the fetch steps checked it (a build step between edits a tracked file): the build fails
    right after that step, naming it and the file (torchkiln.build.treewatch), and publishes nothing."""
    import sys

    from torchkiln.errors import BuildFailed
    from torchkiln.plan.model import Step

    work, dist = tmp_path / "work", tmp_path / "dist"
    url = f"file://{upstream['repo']}"
    target = work / "src" / "pytorch" / "VERSION"
    edit = Step("edit", "env", "", (sys.executable, "-c", f"open({str(target)!r}, 'w').write('x')"))
    with pytest.raises(
        BuildFailed,
        match=r"^edit: 1 path\(s\) of the torch tree \S+ that its commit tracks \(or git's own data about it\) "
        r"changed: modified VERSION \(content\); .*nothing was published \(dist/ is unchanged\)",
    ):
        fetch_publish(work, dist, url, extra=[edit])
    assert not dist.exists() or not any(dist.iterdir())


def test_a_source_dir_tree_the_user_changes_is_built_and_recorded(upstream, tmp_path: Path) -> None:
    tree = tmp_path / "mine"
    subprocess.run(["git", "clone", "-q", str(upstream["repo"]), str(tree)], check=True, env=ENV)
    (tree / "VERSION").write_text("mine\n")
    recipe = parse_recipe(fetch_recipe_text(f"file://{upstream['repo']}", "v1").encode(), "fetch-test.toml")
    plan = make_plan(
        recipe, workdir=tmp_path / "work", dist=tmp_path / "dist", only="torch", source_dirs={"torch": tree},
        cache=resolve_cache(recipe.cache, kind="none"),
    )  # fmt: skip
    plan = replace(plan, steps=[plan.steps[-1]])
    result = run_build(plan, BuildOptions(console=Console(file=io.StringIO()), skip_postcheck=True))
    torch = json.loads(result.manifest.read_text())["sources"]["torch"]
    assert torch["provided"] is True and torch["dirty"] is True and torch["changed"] == ["VERSION"]


def test_cli_refuses_a_changed_checkout_in_one_message_without_a_traceback(upstream, tmp_path: Path) -> None:
    import sys

    work, dist = tmp_path / "work", tmp_path / "dist"
    url = f"file://{upstream['repo']}"
    fetch_publish(work, dist, url)
    (work / "src" / "pytorch" / "VERSION").write_text("edited\n")
    recipe = tmp_path / "fetch-test.toml"
    recipe.write_text(fetch_recipe_text(url, "v1"))
    root = ROOT
    done = subprocess.run(
        [sys.executable, "-m", "torchkiln", "build", str(recipe), "--only", "torch", "--workdir", str(work),
         "--dist", str(dist), "--cache", "none", "--no-preflight", "--env-store", "off"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(root / "src")}, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "differs from v1" in done.stderr and "modified VERSION (content)" in done.stderr
