"""Issue 35 item 2: what is built from a fetched ref is exactly that commit's tree plus the build's own outputs.

Real git, a local upstream with a submodule, the real plan's fetch steps, a stand-in compile step (the plan's
own ``torch:wheel`` step, its command replaced by one that writes into the tree as setup.py does and leaves a
wheel) and the real publish step. The variants are drawn from git's own status grammar (git-status(1),
porcelain v2: ``?`` untracked, ``!`` ignored, ``.M``/``M.`` modified, ``.D``/``D.`` deleted, ``A.`` added,
``T`` type change, mode change, index flags ``assume-unchanged``/``skip-worktree`` that ``git status`` does
not look at, and a submodule's own untracked, ignored, modified files, its commit, a submodule not checked
out), and the file-system cases around it (a file replaced by a directory, a nested repository, a name that
differs only in case, a name with spaces and non-ASCII). Each variant alone is refused naming its path and
kind; with ``--allow-dirty`` each is recorded with its kind and the sha256 of what was built, in the
manifest, the lock file and the signed provenance.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from kit.dists import tiny_wheel
from rich.console import Console
from test_build_fetch import ENV, fetch_recipe_text, git

from torchkiln.artifacts.signing import load_envelope
from torchkiln.build.loop import BuildOptions, BuildResult, run_build
from torchkiln.cache import resolve_cache
from torchkiln.errors import BuildFailed
from torchkiln.plan.make import make_plan
from torchkiln.plan.model import Plan, Step
from torchkiln.recipe.loader import parse_recipe
from torchkiln.source.exact import git_differences

GITIGNORE = "*.so\nbuild/\n*.egg-info/\nkiln/version.py\nkiln/generated.py\n"  # as torchvision 0.21.0's own


def _commit_all(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A 'pytorch' repository at tag v1 with an executable, a symlink, an ignore file and a submodule
    (third_party/dep, which ignores ``*.o``) at a commit older than its branch's tip."""
    root = tmp_path_factory.mktemp("upstream")
    dep = root / "dep"
    dep.mkdir()
    git(dep, "init", "-q")
    (dep / "dep.txt").write_text("dep v1\n")
    (dep / ".gitignore").write_text("*.o\n")
    _commit_all(dep, "dep v1")
    dep_v1 = git(dep, "rev-parse", "HEAD")
    (dep / "dep.txt").write_text("dep v2\n")
    _commit_all(dep, "dep v2")
    top = root / "pytorch"
    (top / "kiln").mkdir(parents=True)
    git(top, "init", "-q")
    (top / "version.txt").write_text("2.13.0a0\n")
    (top / "setup.py").write_text("# stands in for torch\n")
    (top / "kiln" / "__init__.py").write_text("X = 1\n")
    (top / "run.sh").write_text("#!/bin/sh\necho run\n")
    (top / "run.sh").chmod(0o755)
    (top / "notes").mkdir()
    (top / "notes" / "a.txt").write_text("a\n")
    (top / "link").symlink_to("kiln/__init__.py")
    (top / ".gitignore").write_text(GITIGNORE)
    git(top, "-c", "protocol.file.allow=always", "submodule", "add", "-q", f"file://{dep}", "third_party/dep")
    git(top / "third_party" / "dep", "checkout", "-q", dep_v1)
    _commit_all(top, "v1")
    git(top, "tag", "v1")
    return {"url": f"file://{top}", "dep_v1": dep_v1, "dep_v2": git(dep, "rev-parse", "HEAD")}


def stand_in_compile(step: Step, tree: Path, wheel: Path, *, extra: str = "") -> Step:
    """The plan's compile step (its env with the wheel's label, its scratch build/, its wheel directory),
    its command replaced by one that writes into the tree as setup.py does (build/obj.o, the ignored
    kiln/version.py, an egg-info) and copies a ready wheel into the wheelhouse."""
    code = (
        "import pathlib, shutil, sys; t = pathlib.Path(sys.argv[1]); "
        "(t / 'build').mkdir(exist_ok=True); (t / 'build' / 'obj.o').write_bytes(b'object'); "
        "(t / 'kiln' / 'version.py').write_text('__version__ = \"2.13.0\"\\n'); "
        "(t / 'kiln.egg-info').mkdir(exist_ok=True); (t / 'kiln.egg-info' / 'PKG-INFO').write_text('x'); "
        f"{extra}"
        "shutil.copy(sys.argv[2], sys.argv[3])"
    )
    assert step.wheels is not None
    return replace(step, argv=(sys.executable, "-c", code, str(tree), str(wheel), step.wheels))


@dataclass
class World:
    root: Path
    url: str
    edits: str = "test_tree_exact"  # the module whose EDITS the edit steps apply

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def dist(self) -> Path:
        return self.root / "dist"

    @property
    def checkout(self) -> Path:
        return self.work / "src" / "pytorch"

    def plan(self, dist: Path) -> Plan:
        recipe = parse_recipe(fetch_recipe_text(self.url, "v1").encode(), "fetch-test.toml")
        return make_plan(
            recipe, workdir=self.work, dist=dist, only="torch", cache=resolve_cache(recipe.cache, kind="none")
        )

    def fetch(self) -> None:
        """The fetch steps alone (and a publish into a dist/ of their own): the checkout a user edits next."""
        plan = self.plan(self.root / "fetched")
        steps = [s for s in plan.steps if s.kind == "fetch"] + [plan.steps[-1]]
        options = BuildOptions(console=Console(file=io.StringIO()), skip_postcheck=True)
        run_build(replace(plan, steps=steps), options)

    def build(
        self,
        *,
        allow_dirty: bool = False,
        force: bool = False,
        between: str | None = None,
        after: str | None = None,
        sign: bool = False,
        compile_extra: str = "",
        after_kind: str = "env",
        isolation: bool = True,
        skip_postcheck: bool = True,
    ) -> tuple[BuildResult, str]:
        """fetch steps, a step that applies the edit named ``between`` (after the fetch, before the
        compile), the stand-in compile (running ``compile_extra`` too), a step of ``after_kind`` that applies
        ``after``, publish."""
        plan = self.plan(self.dist)
        made = self.root / "made"
        made.mkdir(exist_ok=True)
        wheel = tiny_wheel(made, "torch", "2.13.0+cpu")
        compile_step = next(s for s in plan.steps if s.kind == "compile")
        steps = [s for s in plan.steps if s.kind == "fetch"]
        steps += [edit_step("edit", between, self.checkout, module=self.edits)] if between else []
        steps.append(stand_in_compile(compile_step, self.checkout, wheel, extra=compile_extra))
        steps += [edit_step("late-edit", after, self.checkout, after_kind, self.edits)] if after else []
        steps.append(plan.steps[-1])
        out = io.StringIO()
        key = ed25519.Ed25519PrivateKey.generate() if sign else None
        options = BuildOptions(
            console=Console(file=out, width=400),
            skip_postcheck=skip_postcheck,
            allow_dirty=allow_dirty,
            force=force,
            sign_key=key,
            isolation=isolation,
            allow_unisolated=not isolation,
        )
        return run_build(replace(plan, steps=steps), options), out.getvalue()


def edit_step(name: str, edit: str, tree: Path, kind: str = "env", module: str = "test_tree_exact") -> Step:
    """A step of the build that applies the table's edit ``edit`` to ``tree`` (in a child process, as every
    step runs: it imports this module and calls the edit by name). The tests' directory is an argument of
    its own: an env step runs sandboxed and sees the absolute paths its command names."""
    code = (
        f"import sys, pathlib; sys.path.insert(0, sys.argv[1]); import {module} as t; "
        f"t.EDITS[{edit!r}](pathlib.Path(sys.argv[2]))"
    )
    return Step(name, kind, "", (sys.executable, "-c", code, str(Path(__file__).parent), str(tree)))


@pytest.fixture
def world(upstream: dict[str, str], tmp_path: Path) -> World:
    return World(tmp_path, upstream["url"])


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------------------------------
# The variants: (name, change to a fetched checkout, the (path, kind) it must be refused for).
# --------------------------------------------------------------------------------------------------


def _run(tree: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True, env=ENV)


def write(relative: str, data: str) -> Callable[[Path], None]:
    def edit(tree: Path) -> None:
        (tree / relative).parent.mkdir(parents=True, exist_ok=True)
        (tree / relative).write_text(data)

    return edit


def untracked_nested_repository(tree: Path) -> None:
    nested = tree / "vendor" / "extra"
    nested.mkdir(parents=True)
    _run(nested, "init", "-q")
    (nested / "code.py").write_text("import os\n")


def staged_modification(tree: Path) -> None:
    (tree / "setup.py").write_text("# staged\n")
    _run(tree, "add", "setup.py")


def staged_addition(tree: Path) -> None:
    (tree / "added.py").write_text("new\n")
    _run(tree, "add", "added.py")


def staged_deletion(tree: Path) -> None:
    _run(tree, "rm", "-q", "notes/a.txt")


def deleted(tree: Path) -> None:
    (tree / "notes" / "a.txt").unlink()


def mode_change(tree: Path) -> None:
    (tree / "run.sh").chmod(0o644)


def mode_gained(tree: Path) -> None:
    (tree / "setup.py").chmod(0o755)


def symlink_to_file(tree: Path) -> None:
    (tree / "link").unlink()
    (tree / "link").write_text("X = 1\n")


def file_to_symlink(tree: Path) -> None:
    (tree / "setup.py").unlink()
    (tree / "setup.py").symlink_to("/etc/hostname")


def symlink_retargeted(tree: Path) -> None:
    (tree / "link").unlink()
    (tree / "link").symlink_to("setup.py")


def link_out_of_the_tree(tree: Path) -> None:
    """The issue's example: a symlink added to the tree, to a file outside it (the wheel holds its bytes)."""
    (tree / "kiln" / "outside.py").symlink_to("/etc/hostname")


LEAVING = {"setup.py", "kiln/outside.py"}  # the variants' links that lead out of the tree


def file_to_directory(tree: Path) -> None:
    (tree / "notes" / "a.txt").unlink()
    (tree / "notes" / "a.txt").mkdir()
    (tree / "notes" / "a.txt" / "inside.py").write_text("x\n")


def assume_unchanged(tree: Path) -> None:
    _run(tree, "update-index", "--assume-unchanged", "setup.py")
    (tree / "setup.py").write_text("# hidden from git status\n")


def skip_worktree(tree: Path) -> None:
    _run(tree, "update-index", "--skip-worktree", "kiln/__init__.py")
    (tree / "kiln" / "__init__.py").write_text("X = 2\n")


def index_without_the_file(tree: Path) -> None:
    """``git rm --cached``: the file is as the commit has it; the index alone lost it (no difference)."""
    _run(tree, "rm", "-q", "--cached", "setup.py")


def submodule_at_other_commit(tree: Path) -> None:
    """The submodule's clone already has its branch's tip (no fetch: an edit step runs sandboxed, without
    the submodule's origin in its view)."""
    _run(tree / "third_party" / "dep", "checkout", "-q", "origin/HEAD")


def submodule_not_checked_out(tree: Path) -> None:
    _run(tree, "submodule", "deinit", "-q", "-f", "third_party/dep")


@dataclass(frozen=True)
class Variant:
    name: str
    edit: Callable[[Path], None]
    expected: tuple[tuple[str, str], ...]  # (path, kind) it must be refused for; () : no difference
    # False: a tree without its submodules is refused after the fetch whatever --allow-dirty says
    # (torchkiln.source.submodules): there is no build of it to record
    buildable: bool = True
    # True: the edit writes the checkout's git data (its index, a submodule's HEAD), which no sandboxed build
    # step can: the user's edit, between builds
    writes_git: bool = False


VARIANTS = (
    Variant("untracked file (?)", write("kiln/evil.py", "import os\n"), (("kiln/evil.py", "extra"),)),
    Variant("untracked in a new directory", write("new/deep/x.py", "x\n"), (("new/deep/x.py", "extra"),)),
    Variant("ignored prebuilt .so (!)", write("kiln/_C.so", "ELF"), (("kiln/_C.so", "extra"),)),
    Variant("ignored generated file", write("kiln/generated.py", "v = 9\n"), (("kiln/generated.py", "extra"),)),
    Variant("planted in the ignored build/", write("build/lib/kiln/evil.py", "e\n"), (("build/lib/kiln/evil.py", "extra"),)),
    Variant("nested repository", untracked_nested_repository, (("vendor/extra/code.py", "extra"),)),
    Variant("case variant of a tracked name", write("SETUP.py", "x\n"), (("SETUP.py", "extra"),)),
    Variant("spaces and non-ASCII", write("kiln/ä b.py", "x\n"), (("kiln/ä b.py", "extra"),)),
    Variant("modified (.M)", write("setup.py", "# edited\n"), (("setup.py", "modified"),)),
    Variant("staged modification (M.)", staged_modification, (("setup.py", "modified"),), writes_git=True),
    Variant("added to the index (A.)", staged_addition, (("added.py", "extra"),), writes_git=True),
    Variant("deleted (.D)", deleted, (("notes/a.txt", "removed"),)),
    Variant("staged deletion (D.)", staged_deletion, (("notes/a.txt", "removed"),), writes_git=True),
    Variant("mode change 100755 -> 100644", mode_change, (("run.sh", "modified"),)),
    Variant("mode change 100644 -> 100755", mode_gained, (("setup.py", "modified"),)),
    Variant("type change symlink -> file (T)", symlink_to_file, (("link", "modified"),)),
    Variant("type change file -> symlink (T)", file_to_symlink, (("setup.py", "modified"),)),
    Variant("symlink retargeted", symlink_retargeted, (("link", "modified"),)),
    Variant("untracked symlink out of the tree", link_out_of_the_tree, (("kiln/outside.py", "extra"),)),
    Variant("file replaced by a directory", file_to_directory, (("notes/a.txt", "modified"), ("notes/a.txt/inside.py", "extra"))),
    Variant("assume-unchanged file edited", assume_unchanged, (("setup.py", "modified"),), writes_git=True),
    Variant("skip-worktree file edited", skip_worktree, (("kiln/__init__.py", "modified"),), writes_git=True),
    Variant("submodule: untracked file", write("third_party/dep/evil.c", "x\n"), (("third_party/dep/evil.c", "extra"),)),
    Variant("submodule: ignored file", write("third_party/dep/pre.o", "o\n"), (("third_party/dep/pre.o", "extra"),)),
    Variant("submodule: modified file", write("third_party/dep/dep.txt", "edited\n"), (("third_party/dep/dep.txt", "modified"),)),
    Variant("submodule at another commit", submodule_at_other_commit, (("third_party/dep", "modified"),), writes_git=True),
    Variant("submodule not checked out", submodule_not_checked_out, (("third_party/dep", "removed"),), buildable=False, writes_git=True),
    Variant("index without a file the tree has (git rm --cached)", index_without_the_file, (), writes_git=True),
)  # fmt: skip
EDITS: dict[str, Callable[[Path], None]] = {v.name: v.edit for v in VARIANTS}
EDITS["planted at the compile's output path"] = write("build/obj.o", "planted\n")
EDITS["a file after the compile"] = write("kiln/late.py", "late\n")


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_each_difference_from_the_commit_is_found_by_path_and_kind(
    variant: Variant, upstream: dict[str, str], tmp_path: Path
) -> None:
    """git_differences against the table: exactly the expected paths and kinds (fast: git alone)."""
    checkout = tmp_path / "checkout"
    subprocess.run(
        ["git", "-c", "protocol.file.allow=always", "clone", "-q", "--recurse-submodules", upstream["url"], str(checkout)],
        check=True, capture_output=True, env=ENV,
    )  # fmt: skip
    _run(checkout, "checkout", "-q", "v1")
    _run(checkout, "-c", "protocol.file.allow=always", "submodule", "update", "-q", "--init", "--recursive")
    assert git_differences(checkout) == []
    variant.edit(checkout)
    found = {(d.path, d.kind) for d in git_differences(checkout)}
    assert found == set(variant.expected)


BUILD_STEP_EDITS = [v for v in VARIANTS if v.expected and not v.writes_git]


@pytest.mark.integration  # 19 variants x 1 build (fetch, the edit, stand-in compile, publish): ~15 s
@pytest.mark.parametrize("variant", BUILD_STEP_EDITS, ids=[v.name for v in BUILD_STEP_EDITS])
def test_a_build_step_that_changes_the_checkout_is_refused_by_name(variant: Variant, world: World) -> None:
    """A build step (an env step, sandboxed) makes the change after the fetch: a path the commit tracks is
    refused right after that step, naming the step, the path and how (torchkiln.build.treewatch); an
    untracked one by the compile, before it runs, naming the path and kind. Nothing is published."""
    with pytest.raises(BuildFailed) as refused:
        world.build(between=variant.name)
    message = str(refused.value)
    tracked = [(path, kind) for path, kind in variant.expected if kind != "extra"]
    for path, kind in tracked or variant.expected:
        assert f"{kind} {path} (" in message, message
    if tracked:
        assert message.startswith("edit: ") and "nothing was published (dist/ is unchanged)" in message
        assert refused.value.step == "edit"
    else:
        assert "nothing was compiled" in message
    assert not world.dist.exists()


USER_EDITS = [v for v in VARIANTS if v.expected]


@pytest.mark.integration  # 27 variants x 3 builds (fetch; fetch, stand-in compile, publish): ~1 min
@pytest.mark.parametrize("variant", USER_EDITS, ids=[v.name for v in USER_EDITS])
def test_the_build_refuses_each_difference_by_name_and_allow_dirty_records_its_digest(
    variant: Variant, world: World
) -> None:
    """The user changes the fetched checkout between builds: the next build refuses it after the fetch
    steps, naming the path and kind, nothing is published; --allow-dirty builds it and records each path
    with its kind and the sha256 of what was built, in the manifest, the lock and the provenance."""
    world.fetch()
    variant.edit(world.checkout)
    with pytest.raises(BuildFailed) as refused:
        world.build()
    message = str(refused.value)
    if not variant.buildable:  # a tree without its submodules: refused whatever --allow-dirty says
        assert "lacks its submodules" in message and "third_party/dep" in message, message
        return
    for path, kind in variant.expected:
        assert f"{kind} {path} (" in message, message
    assert "nothing was built" in message and not world.dist.exists()
    result, said = world.build(allow_dirty=True, sign=True)
    assert "--allow-dirty: torch was built from" in said
    manifest = json.loads(result.manifest.read_text())
    lock = json.loads(result.lock.read_text())
    assert manifest["sources"]["torch"] == lock["sources"]["torch"]
    recorded = {c["path"]: c for c in lock["sources"]["torch"]["tree_changes"]}
    assert lock["sources"]["torch"]["dirty"] is True
    for path, kind in variant.expected:
        entry = recorded[path]
        assert entry["kind"] == kind
        target = world.checkout / path
        if target.is_symlink() and kind != "removed":  # a link as a link: its text, never what it reaches
            assert (entry["link"], entry["sha256"]) == (os.readlink(target), None), path
        elif kind == "removed" or target.is_dir():
            assert (entry["link"], entry["sha256"]) == (None, None)
        else:
            assert (entry["link"], entry["sha256"]) == (None, sha256_of(target)), path
    assert set(recorded) == {p for p, _ in variant.expected}, "the build's own outputs are no change"
    leaving = [p for p, _ in variant.expected if (world.checkout / p).is_symlink() and p in LEAVING]
    assert [link["path"] for link in lock["sources"]["torch"]["outside_links"]] == leaving
    assert result.provenance is not None
    statement = json.loads(load_envelope(result.provenance).payload)
    torch = next(
        d for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"] if d["name"] == "torch"
    )
    assert {c["path"]: c["sha256"] for c in torch["annotations"]["tree_changes"]} == {
        p: c["sha256"] for p, c in recorded.items()
    }


def test_the_builds_own_outputs_are_no_difference_and_a_rerun_is_clean(world: World) -> None:
    first, _ = world.build()
    lock = json.loads(first.lock.read_text())["sources"]["torch"]
    assert lock["dirty"] is False and lock["tree_changes"] == [] and lock["changed"] == []
    assert (world.checkout / "build" / "obj.o").is_file() and (
        world.checkout / "kiln" / "version.py"
    ).is_file()
    records = json.loads((world.work / "tree-outputs" / "torch:wheel.json").read_text())
    assert {"build/obj.o", "kiln/version.py", "kiln.egg-info/PKG-INFO"} <= set(records)
    again, _ = world.build()
    assert again.ran == [] and json.loads(again.lock.read_text())["sources"]["torch"]["dirty"] is False


def test_a_file_planted_at_an_output_path_before_the_build_is_not_the_builds(world: World) -> None:
    """build/obj.o is where the compile writes; one there before the compile is refused (--force, which
    empties build/, builds), and one replaced after the build (the same bytes, a new inode and ctime) is
    refused by the next run's check."""
    planted = "planted at the compile's output path"
    with pytest.raises(BuildFailed, match=r"extra build/obj\.o \(ignored\); nothing was compiled"):
        world.build(between=planted)
    forced, _ = world.build(force=True, between=planted)
    assert json.loads(forced.lock.read_text())["sources"]["torch"]["dirty"] is False
    obj = world.checkout / "build" / "obj.o"
    data = obj.read_bytes()
    obj.unlink()
    obj.write_bytes(data)
    with pytest.raises(BuildFailed, match=r"extra build/obj\.o \(ignored\); nothing was built"):
        world.build()


def test_a_file_that_slips_in_after_the_compile_is_refused_at_publish(world: World) -> None:
    with pytest.raises(BuildFailed, match=r": extra kiln/late\.py \(untracked\); nothing was published"):
        world.build(after="a file after the compile")
    assert not world.dist.exists() or not any(world.dist.iterdir())


def test_a_tree_without_git_is_recorded_by_the_digest_of_all_but_the_builds_own_outputs(
    tmp_path: Path,
) -> None:
    """A --source-dir tree that is no git checkout (an extracted tarball) has no commit to differ from: its
    record is tree_sha256 over every entry but what the build itself wrote. A build/ file the build did not
    write (planted before it) is covered; the build's own (build/obj.o, version.py, egg-info) are not; a
    rerun is a no-op and records the same digest."""
    from torchkiln.files.digests import tree_sha256

    tree = plain_tree(tmp_path)
    (tree / "build" / "lib").mkdir(parents=True)
    (tree / "build" / "lib" / "evil.py").write_text("planted before the build\n")
    pristine = tree_sha256(tree)
    first, _ = given_tree_build(tree, tmp_path)
    lock = json.loads(first.lock.read_text())["sources"]["torch"]
    assert lock["commit"] is None and lock["tree_sha256"] == pristine
    own = sorted(json.loads((tmp_path / "w" / "tree-outputs" / "torch:wheel.json").read_text()))
    assert {"build/obj.o", "kiln/version.py", "kiln.egg-info/PKG-INFO"} <= set(own)
    assert "build/lib/evil.py" not in own
    assert tree_sha256(tree, own) == pristine != tree_sha256(tree)
    assert tree_sha256(tree, [*own, "build/lib/evil.py"]) != pristine, "the planted file is in the record"
    again, _ = given_tree_build(tree, tmp_path)
    assert (
        again.ran == [] and json.loads(again.lock.read_text())["sources"]["torch"]["tree_sha256"] == pristine
    )


# --------------------------------------------------------------------------------------------------
# Issue 45 item 2: every symbolic link of a recorded tree is recorded as a link (its text), never as the
# bytes of what it points to; a link that leads out of the tree is refused unless --allow-dirty, which
# records it. The shapes: (where the link is, its text made from the tree and a directory outside it, whether
# it leads out). The oracle for "leads out" is coreutils' own `realpath -m`.
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkShape:
    name: str
    links: tuple[tuple[str, Callable[[Path, Path], str]], ...]  # (path in the tree, its text)
    leaves: tuple[str, ...]  # the links of it that lead out of the tree


def _inside(text: str) -> Callable[[Path, Path], str]:
    return lambda tree, outside: text


LINK_SHAPES = (
    LinkShape("relative, to a file in the tree", (("ln", _inside("kiln/__init__.py")),), ()),
    LinkShape("absolute, to a file in the tree", (("ln", lambda t, o: str(t / "setup.py")),), ()),
    LinkShape("to a directory in the tree", (("ln", _inside("kiln")),), ()),
    LinkShape("into the tree from a subdirectory", (("kiln/ln", _inside("../setup.py")),), ()),
    LinkShape("chain inside the tree", (("ln", _inside("ln2")), ("ln2", _inside("setup.py"))), ()),
    LinkShape("dangling, inside the tree", (("ln", _inside("missing.py")),), ()),
    LinkShape("absolute, to a file outside", (("ln", lambda t, o: str(o / "outside.txt")),), ("ln",)),
    LinkShape("relative, to a file outside", (("kiln/ln", lambda t, o: os.path.relpath(o / "outside.txt", t / "kiln")),), ("kiln/ln",)),
    LinkShape("to a directory outside", (("ln", lambda t, o: str(o)),), ("ln",)),
    LinkShape("to a system file", (("ln", _inside("/etc/hostname")),), ("ln",)),
    LinkShape("chain ending outside", (("ln", _inside("ln2")), ("ln2", lambda t, o: str(o / "outside.txt"))), ("ln", "ln2")),
    LinkShape("dangling, outside", (("ln", _inside("/nonexistent/kiln/x")),), ("ln",)),
    LinkShape("'..' past the top", (("ln", _inside("kiln/../../outside.txt")),), ("ln",)),
    LinkShape("through a directory link outside, back up", (("out", lambda t, o: str(o / "sub")), ("ln", _inside("out/../outside.txt"))), ("ln", "out")),
)  # fmt: skip


def make_links(shape: LinkShape, tree: Path, outside: Path) -> dict[str, str]:
    """The shape's links in ``tree`` (``outside`` holds outside.txt and sub/); their texts by path."""
    (outside / "sub").mkdir(parents=True, exist_ok=True)
    (outside / "outside.txt").write_text("outside\n")
    texts = {}
    for relative, text in shape.links:
        texts[relative] = text(tree, outside)
        (tree / relative).symlink_to(texts[relative])
    return texts


def realpath_leaves(tree: Path, relative: str) -> bool:
    """coreutils' realpath -m (every link followed, missing components allowed) against the tree's own."""
    argv = ["realpath", "-m", "--"]
    top, found = subprocess.run(
        [*argv, str(tree), str(tree / relative)], capture_output=True, text=True, check=True
    ).stdout.split("\n")[:2]
    return not (found == top or found.startswith(top + "/"))  # fmt: skip


def plain_tree(root: Path) -> Path:
    tree = root / "tree"
    (tree / "kiln").mkdir(parents=True)
    (tree / "version.txt").write_text("2.13.0a0\n")
    (tree / "setup.py").write_text("# stands in for torch\n")
    (tree / "kiln" / "__init__.py").write_text("X = 1\n")
    return tree


@pytest.mark.parametrize("shape", LINK_SHAPES, ids=[s.name for s in LINK_SHAPES])
def test_which_links_lead_out_of_a_tree_as_realpath_says(shape: LinkShape, tmp_path: Path) -> None:
    from torchkiln.source.exact import leaves, outside_links

    tree = plain_tree(tmp_path)
    texts = make_links(shape, tree, tmp_path / "outside")
    for relative in texts:
        assert leaves(tree, relative) is realpath_leaves(tree, relative), relative
    found = outside_links(tree, [*texts, "setup.py", "kiln"])
    assert [(link.path, link.link) for link in found] == [(p, texts[p]) for p in sorted(shape.leaves)]


def given_tree_build(
    tree: Path, root: Path, *, allow_dirty: bool = False, sign: bool = False, compile_extra: str = ""
) -> tuple[BuildResult, str]:
    """A --source-dir build of ``tree``: the stand-in compile and the real publish step."""
    from torchkiln.recipe.loader import load_recipe

    recipe = load_recipe(Path(__file__).parent / "data" / "ext-cpu-test.toml")
    plan = make_plan(
        recipe, workdir=root / "w", dist=root / "d", only="torch", source_dirs={"torch": tree},
        cache=resolve_cache(None, kind="none"),
    )  # fmt: skip
    made = root / "made"
    made.mkdir(exist_ok=True)
    wheel = tiny_wheel(made, "torch", "2.13.0+cpu")
    compile_step = next(s for s in plan.steps if s.kind == "compile")
    steps = [stand_in_compile(compile_step, tree, wheel, extra=compile_extra), plan.steps[-1]]
    out = io.StringIO()
    key = ed25519.Ed25519PrivateKey.generate() if sign else None
    options = BuildOptions(
        console=Console(file=out, width=400), skip_postcheck=True, allow_dirty=allow_dirty, sign_key=key
    )
    return run_build(replace(plan, steps=steps), options), out.getvalue()


TREE_KINDS = ("no git", "git, the links committed", "git, the links added")


@pytest.mark.integration  # 14 shapes x 3 trees x up to 2 builds (stand-in compile, real publish): ~1 min
@pytest.mark.parametrize("kind", TREE_KINDS)
@pytest.mark.parametrize("shape", LINK_SHAPES, ids=[s.name for s in LINK_SHAPES])
def test_a_given_trees_links_are_recorded_as_links_and_those_leading_out_are_refused(
    shape: LinkShape, kind: str, tmp_path: Path
) -> None:
    """Each shape in a --source-dir tree (no git; git with the links in its commit; git with them added
    after): a tree whose links all stay inside builds; one with a link leading out is refused before
    anything runs, naming the link and its text; with --allow-dirty it builds, and the lock, manifest and
    signed provenance record every such link by its text, and a changed link as a link (its text, no
    sha256), never as the bytes it points to."""
    tree = plain_tree(tmp_path)
    if kind != "no git":
        _run(tree, "init", "-q")
        _commit_all(tree, "tree")
    texts = make_links(shape, tree, tmp_path / "outside")
    if kind == "git, the links committed":
        _commit_all(tree, "links")
    if shape.leaves:
        with pytest.raises(BuildFailed) as refused:
            given_tree_build(tree, tmp_path)
        message = str(refused.value)
        for relative in shape.leaves:
            assert f"{relative} -> {texts[relative]}" in message, message
        assert "nothing was built" in message and not (tmp_path / "d").exists()
    result, said = given_tree_build(tree, tmp_path, allow_dirty=bool(shape.leaves), sign=True)
    lock = json.loads(result.lock.read_text())["sources"]["torch"]
    assert lock == json.loads(result.manifest.read_text())["sources"]["torch"]
    assert lock["outside_links"] == [{"path": p, "link": texts[p]} for p in sorted(shape.leaves)]
    if shape.leaves:
        assert "whose links lead out of it" in said
    if kind == "git, the links added":  # each link is a change of the tree: recorded as a link
        changes = {c["path"]: c for c in lock["tree_changes"]}
        assert {p: (c["link"], c["sha256"]) for p, c in changes.items()} == {
            p: (t, None) for p, t in texts.items()
        }
    assert result.provenance is not None
    statement = json.loads(load_envelope(result.provenance).payload)
    resolved = statement["predicate"]["buildDefinition"]["resolvedDependencies"]
    torch = next(d for d in resolved if d["name"] == "torch")
    assert torch["annotations"].get("outside_links", []) == lock["outside_links"]


def test_a_link_out_of_the_tree_in_the_fetched_commit_itself_is_refused_at_publish(tmp_path: Path) -> None:
    """A link the commit holds (git status never lists it) that leads out of the tree: the fetched build is
    not published; --allow-dirty publishes it with the link recorded by its text (the tree is its commit's:
    no change)."""
    top = tmp_path / "up" / "pytorch"
    (top / "kiln").mkdir(parents=True)
    git(top, "init", "-q")
    (top / "version.txt").write_text("2.13.0a0\n")
    (top / "setup.py").write_text("# stands in for torch\n")
    (top / "kiln" / "__init__.py").write_text("X = 1\n")
    (top / "kiln" / "host.py").symlink_to("/etc/hostname")
    _commit_all(top, "v1")
    git(top, "tag", "v1")
    world = World(tmp_path / "world", f"file://{top}")
    world.root.mkdir()
    with pytest.raises(BuildFailed, match=r"kiln/host\.py -> /etc/hostname; .*nothing was published"):
        world.build()
    result, said = world.build(allow_dirty=True)
    lock = json.loads(result.lock.read_text())["sources"]["torch"]
    assert lock["outside_links"] == [{"path": "kiln/host.py", "link": "/etc/hostname"}]
    assert lock["tree_changes"] == [] and "whose links lead out of it: kiln/host.py -> /etc/hostname" in said


@pytest.mark.parametrize("shape", ["dangling link", "link to a file", "chain ending nowhere"])
def test_a_source_dir_link_that_reaches_no_directory_is_refused_by_name(shape: str, tmp_path: Path) -> None:
    """The --source-dir shapes that are no tree (those that reach one build: test_isolation_build.py): a
    usage error naming the argument, before anything is planned."""
    from torchkiln.commands.plan import parse_source_dirs
    from torchkiln.errors import UsageError

    (tmp_path / "file").write_text("x")
    given = tmp_path / "given"
    target = {"dangling link": "missing", "link to a file": "file", "chain ending nowhere": "middle"}[shape]
    given.symlink_to(target)
    if shape == "chain ending nowhere":
        (tmp_path / "middle").symlink_to("nowhere")
    with pytest.raises(UsageError, match=rf"--source-dir 'torch={given}': {given} is not a directory"):
        parse_source_dirs([f"torch={given}"])
