"""Issue 35 item 3: the version a wheel is labelled with always comes from a check of the tree itself.

The class: every option that skips something (``--no-preflight``, ``--skip-postcheck``, ``--only``, ``--torch``,
``--source-dir``) x every way a tree's ``version.txt`` can name another release than the label (a patch,
minor or major away, with the pre-release, post-release, dev and local forms upstream's trees and builds use:
PyTorch's release tags carry ``X.Y.Za0``, torchvision's ``X.Y.Z``; checked on Debian's orig tarballs of
2.6.0 and 0.21.0), generated with hypothesis. ``plan`` and ``build`` refuse a given tree naming its
version file; the same versions in the same release pass. The build loop checks again where the command line
cannot: after a fetch (a ref that is not the recipe's release) and right before each compile (a tree
changed after planning; a library caller that never planned through the command line).
"""

from __future__ import annotations

import io
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kit import ROOT
from kit.dists import tiny_wheel
from kit.imagekit import examples, unisolated_signing_allowed
from rich.console import Console
from test_build_fetch import fetch_recipe_text, git

from torchkiln.build.loop import BuildOptions, run_build
from torchkiln.cache import resolve_cache
from torchkiln.cli import main
from torchkiln.errors import BuildFailed
from torchkiln.plan.make import make_plan
from torchkiln.plan.model import Step
from torchkiln.recipe.loader import load_recipe, parse_recipe
from torchkiln.source.version import label_problem, release_of

HERE = ROOT / "tests"
CPU = ROOT / "recipes" / "torch-2.13-cpu-py311.toml"
VISION_LIKE = HERE / "data" / "vision_like"
RELEASES = {"torch": "2.13.0", "torchvision": "0.28.0"}  # the CPU recipe's

# A version.txt as a tree may state it: a release moved by (major, minor, patch), then the forms PEP 440 and
# upstream use after it, and the whitespace a file may carry.
SHIFTS = ((0, 0, 0), (0, 0, 1), (0, 0, -1), (0, 1, 0), (0, -1, 0), (1, 0, 0))
SUFFIXES = ("", "a0", "a1", "b2", "rc1", ".post1", ".dev0", "a0.dev20250101")
LOCALS = ("", "+cpu", "+git.abc1234", "+cu130")
SPACING = ("{}\n", "{}", "  {}  \n", "{}\r\n", "{}\n# a comment line\n")


@st.composite
def tree_versions(draw: st.DrawFn, release: str) -> tuple[str, bool]:
    """(the text of a version.txt, whether a wheel labelled as the final ``release`` may be built from it:
    the release itself or upstream's marker a0, on one line; a pre, dev, post or local part is a version
    the final label would misstate, two lines state none: issue 45)."""
    kind = draw(st.sampled_from(("version", "version", "version", "garbage", "empty")))
    if kind == "garbage":
        return draw(st.sampled_from(("main", "v2", "unknown", "2.x", "release-2.13.0"))) + "\n", False
    if kind == "empty":
        return draw(st.sampled_from(("", "\n", "   "))), False
    major, minor, patch = map(int, release.split("."))
    shift = draw(st.sampled_from(SHIFTS))
    moved = (major + shift[0], minor + shift[1], patch + shift[2])
    if min(moved) < 0:
        moved, shift = (major, minor, patch), (0, 0, 0)
    suffix, local, spacing = (
        draw(st.sampled_from(SUFFIXES)),
        draw(st.sampled_from(LOCALS)),
        draw(st.sampled_from(SPACING)),
    )
    text = ".".join(map(str, moved)) + suffix + local
    final = suffix in ("", "a0") and not local and "#" not in spacing
    return spacing.format(text), shift == (0, 0, 0) and final  # fmt: skip


def torch_wheel(directory: Path) -> Path:
    """A CPU torch 2.13.0 wheel, as --torch WHEEL reads one (its torch/version.py says cuda = None)."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {"torch/__init__.py": "", "torch/version.py": "__version__ = '2.13.0+cpu'\ncuda = None\n"}
    return tiny_wheel(directory, "torch", "2.13.0+cpu", files=files, tag="cp311-cp311-linux_x86_64")


def trees(root: Path, texts: dict[str, str | None]) -> dict[str, Path]:
    """A given tree per project, its version.txt ``texts[project]`` (None: no version.txt)."""
    out = {}
    for project, text in texts.items():
        tree = root / project
        if not tree.exists():
            shutil.copytree(VISION_LIKE, tree)
        (tree / "version.txt").unlink(missing_ok=True)
        if text is not None:
            (tree / "version.txt").write_text(text)
        out[project] = tree
    return out


# The option combinations that skip something, per command. `build` uses --dist = --workdir, which build
# refuses right after planning (so no combination starts a build): a label problem is refused before that.
OPTIONS: tuple[tuple[str, ...], ...] = (
    (),
    ("--only", "torch"),
    ("--only", "torchvision"),
    ("--only", "torchvision", "--torch", "{wheel}"),
    ("--no-preflight",),
    ("--skip-postcheck",),
    ("--no-preflight", "--skip-postcheck", "--only", "torchvision", "--torch", "{wheel}"),
    ("--no-preflight", "--skip-postcheck", "--only", "torch"),
)


@settings(
    max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    command=st.sampled_from(("plan", "build")),
    options=st.sampled_from(OPTIONS),
    torch_text=tree_versions(RELEASES["torch"]),
    vision_text=tree_versions(RELEASES["torchvision"]),
)
def test_a_given_tree_of_another_release_is_refused_whatever_is_skipped(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    options: tuple[str, ...],
    torch_text: tuple[str, bool],
    vision_text: tuple[str, bool],
) -> None:
    if command == "plan" and any(o in options for o in ("--no-preflight", "--skip-postcheck")):
        options = tuple(o for o in options if o not in ("--no-preflight", "--skip-postcheck"))
    only = options[options.index("--only") + 1] if "--only" in options else None
    projects = (only,) if only else ("torch", "torchvision")
    texts = {"torch": torch_text, "torchvision": vision_text}
    given = trees(tmp_path / "trees", {p: texts[p][0] for p in projects})
    wheel = torch_wheel(tmp_path / "wheels")
    argv = [command, str(CPU), *(o.format(wheel=wheel) for o in options)]
    for project, tree in given.items():
        argv += ["--source-dir", f"{project}={tree}"]
    argv += ["--workdir", str(tmp_path / "w")]
    if command == "build":
        argv += ["--dist", str(tmp_path / "w")]
    status = main(argv)
    out, err = capsys.readouterr()
    wrong = [p for p in projects if not texts[p][1]]
    if wrong:
        assert status == 2, (argv, out, err)
        for project in wrong:
            assert f"{project}: the wheel would be labelled {RELEASES[project]}+cpu.kiln1" in err, err
            assert f"the tree {given[project]} is not that release: its version.txt" in err, err
        assert "Traceback" not in err and RELEASES["torch"] + "+cpu.kiln1" not in out
    elif command == "plan":
        assert status == 0, err
        for project in projects:
            assert f"{RELEASES[project]}+cpu.kiln1" in out
    else:
        assert status == 2 and "--dist and --workdir must be different directories" in err, err


@pytest.mark.parametrize(
    ("text", "label", "same"),
    [
        ("2.6.0a0\n", "2.6.0+cpu.kiln1", True),  # upstream's release tag v2.6.0
        ("0.21.0\n", "0.21.0+cu124", True),  # torchvision's v0.21.0
        ("2.6.0a0\n", "2.6.1+cpu", False),
        ("2.6.0a0\n", "2.5.0", False),
        ("2.6.0rc1\n", "2.6.0", False),  # issue 45: a release candidate is not the final release
        ("2.6.0rc1\n", "2.6.0rc1+cpu", True),  # ... labelled as what it is
        ("2.6.0+git1a2b3c\n", "2.6.0", False),  # a tree's own local label: refused by name
        ("2.6.0+git1a2b3c\n", "2.6.0+git1a2b3c", False),
        ("2.6\n", "2.6.0", True),
        ("2.6.0.0\n", "2.6.0", True),  # PEP 440's zero padding
        ("2.6.0.1\n", "2.6.0", False),  # not 2.6.0 (only the first three parts were compared before)
        ("1!2.6.0\n", "2.6.0", False),  # another epoch
        ("2.6.0\n", "2.6.0.post2", True),  # the recipe's own post-release of a final tree
        ("2.6.0\n", "2.6.0rc1", True),  # ... and an RC built from a release branch
        ("2.6.0.post1\n", "2.6.0", False),
        ("2.6.0.post1\n", "2.6.0.post1+cpu", True),
        ("2.6.0.dev20260101\n", "2.6.0", False),
        ("2.6.0a0.dev1\n", "2.6.0", False),  # the marker with a dev part is no marker
        ("3.6.0a0\n", "2.6.0", False),
        ("not-a-version\n", "2.6.0", False),
        ("2.6.0\n2.7.0\n", "2.6.0", False),
        ("\ufeff2.6.0\n", "2.6.0", False),
        (None, "2.6.0", False),
    ],
)
def test_label_and_tree_release(tmp_path: Path, text: str | None, label: str, same: bool) -> None:
    if text is not None:
        (tmp_path / "version.txt").write_text(text)
    assert (label_problem("torch", tmp_path, label) is None) is same
    assert release_of(label) is not None


@pytest.mark.integration  # the real trees: extracted once per session for the integration part
def test_upstreams_release_trees_state_their_release(pytorch_2_6_tree: Path, vision_0_21_tree: Path) -> None:
    """The forms above are upstream's: PyTorch 2.6.0's release source says 2.6.0a0, torchvision 0.21.0's
    says 0.21.0 (Debian's orig tarballs of the releases)."""
    assert (pytorch_2_6_tree / "version.txt").read_text().strip() == "2.6.0a0"
    assert (vision_0_21_tree / "version.txt").read_text().strip() == "0.21.0"
    assert label_problem("torch", pytorch_2_6_tree, "2.6.0+cpu.kiln1") is None
    assert label_problem("torchvision", vision_0_21_tree, "0.21.0+cpu.kiln1") is None
    assert label_problem("torch", pytorch_2_6_tree, "2.5.0+cpu") is not None


# --------------------------------------------------------------------------------------------------
# The build loop: where the command line cannot see the tree.
# --------------------------------------------------------------------------------------------------


def test_a_fetched_ref_of_another_release_is_refused_after_the_fetch(tmp_path: Path) -> None:
    """The recipe says torch 2.13.0; its ref checks out a tree whose version.txt says 2.12.0a0. Nothing
    looks at a fetched tree before the fetch: the build refuses it right after, before any other step."""
    upstream = tmp_path / "up"
    upstream.mkdir()
    git(upstream, "init", "-q")
    (upstream / "version.txt").write_text("2.12.0a0\n")
    git(upstream, "add", "-A")
    git(upstream, "commit", "-qm", "v1")
    git(upstream, "tag", "v1")
    recipe = parse_recipe(fetch_recipe_text(f"file://{upstream}", "v1").encode(), "fetch-test.toml")
    plan = make_plan(
        recipe,
        workdir=tmp_path / "w",
        dist=tmp_path / "d",
        only="torch",
        cache=resolve_cache(None, kind="none"),
    )
    options = BuildOptions(console=Console(file=io.StringIO()), skip_postcheck=True)
    with pytest.raises(BuildFailed) as refused:
        run_build(plan, options)
    message = str(refused.value)
    assert "torch: the wheel would be labelled 2.13.0+cpu (PYTORCH_BUILD_VERSION)" in message
    assert "its version.txt says '2.12.0a0'" in message and "nothing was compiled" in message
    assert not (tmp_path / "w" / "venv").exists() and not (tmp_path / "d").exists()


def test_a_tree_changed_after_planning_is_refused_before_its_compile(tmp_path: Path) -> None:
    """A library caller's plan over a given tree (no command line, no preflight), the tree's version.txt
    rewritten by a step before the compile: refused before the compile, by the tree watch (build.treewatch:
    no step changes what its tree tracks) naming the step and the file, so no label is ever made of it."""
    tree = trees(tmp_path / "trees", {"torchvision": "0.28.0a0\n"})["torchvision"]
    plan = make_plan(
        load_recipe(CPU),
        workdir=tmp_path / "w",
        dist=tmp_path / "d",
        only="torchvision",
        source_dirs={"torchvision": tree},
        cache=resolve_cache(None, kind="none"),
    )
    compile_step = next(s for s in plan.steps if s.kind == "compile")
    edit = (sys.executable, "-c", f"open({str(tree / 'version.txt')!r}, 'w').write('0.27.0\\n')")
    steps = [Step("edit", "env", "", edit), compile_step, plan.steps[-1]]
    options = BuildOptions(console=Console(file=io.StringIO()), skip_postcheck=True)
    with pytest.raises(BuildFailed) as refused:
        run_build(replace(plan, steps=steps), options)
    message = str(refused.value)
    assert refused.value.step == "edit" and "changed: modified version.txt (content)" in message, message
    assert "nothing was published" in message and not (tmp_path / "d").exists()


# --------------------------------------------------------------------------------------------------
# Issue 45 item 3: a pre-release, dev, post or local version is labelled as what it is or refused by name,
# and the tree's own text is recorded beside the label. The texts: every part of PEP 440's grammar (its
# spellings as packaging normalises them), malformed ones, and the ways a file carries a line.
# --------------------------------------------------------------------------------------------------

EPOCHS = ("", "1!")
RELEASES_OF = ("2.13.0", "2.13", "2.13.0.0", "2.13.0.1", "2.13.1", "v2.13.0")
PRES = ("", "a0", "a1", "b2", "rc1", "c1", "-alpha.1", "beta2", "pre3", "preview4", "RC1", "a")
POSTS = ("", ".post1", "-1", "post2", ".rev3", ".r4", "-post5")
DEVS = ("", ".dev0", ".dev2026012", "dev3", "-dev")
LOCAL_PARTS = ("", "+evil", "+cpu.1", "+Git-abc")
CARRIERS = ("{}", "{}\n", "{}\r\n", "  {}  \n", "\t{}\t", "{}\n\n", "\ufeff{}\n", "{}\n{}\n", "{}\n# note\n")
MALFORMED = (
    "",
    "\n",
    "main",
    "2.x",
    "2.13.0-",
    "2..13",
    "2.13.0+",
    "release-2.13.0",
    "2.13.0 rc1",
    "２.13.0",
)

NAMES = {"a": "an alpha", "b": "a beta", "rc": "a release candidate"}


@st.composite
def version_texts(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(MALFORMED))
    parts = [draw(st.sampled_from(x)) for x in (EPOCHS, RELEASES_OF, PRES, POSTS, DEVS, LOCAL_PARTS)]
    return draw(st.sampled_from(CARRIERS)).replace("{}", "".join(parts))


def expected(text: str, label: str) -> tuple[bool, list[str]]:
    """The spec, from packaging alone: (agrees, the names a refusal must carry)."""
    from packaging.version import InvalidVersion, Version

    statement = text.strip(" \t\r\n")
    if text.startswith("\ufeff"):
        return False, ["byte-order mark"]
    if not statement:
        return False, ["is empty"]
    if len(statement.splitlines()) > 1:
        return False, [f"holds {len(statement.splitlines())} lines"]
    try:
        tree = Version(statement)
    except InvalidVersion:
        return False, ["no PEP 440 version"]
    want = Version(label)
    names = []
    if tree.pre is not None and tree.pre != ("a", 0):
        names.append(f"{NAMES[tree.pre[0]]} ({tree.pre[0]}{tree.pre[1]})")
    if tree.post is not None:
        names.append(f"a post-release (.post{tree.post})")
    if tree.dev is not None:
        names.append(f"a development release (.dev{tree.dev})")
    if tree.local is not None:
        return False, [*names, f"a local version label (+{tree.local})"]
    if not names:
        return Version(want.base_version) == Version(tree.base_version), []
    return Version(want.public) == tree, names


@settings(max_examples=examples(400), deadline=None)
@given(text=version_texts(), label=st.sampled_from(("2.13.0+cpu", "2.13.0", "2.13.0rc1+cpu", "2.13.0.post1")))
@example(text="2.13.0rc1\n", label="2.13.0+cpu")  # the examples: each was labelled the final 2.13.0
@example(text="2.13.0.dev20260101\n", label="2.13.0+cpu")
@example(text="2.13.0.post1\n", label="2.13.0+cpu")
@example(text="2.13.0+evil\n", label="2.13.0+cpu")
@example(text="2.13.0\n2.14.0\n", label="2.13.0+cpu")
@example(text="2.13.0.1\n", label="2.13.0+cpu")  # the first three parts alone were compared
def test_each_version_text_is_labelled_as_it_is_or_refused_by_name(
    tmp_path_factory: pytest.TempPathFactory, text: str, label: str
) -> None:
    tree = tmp_path_factory.mktemp("tree")
    (tree / "version.txt").write_bytes(text.encode())
    agrees, names = expected(text, label)
    problem = label_problem("torch", tree, label)
    assert (problem is None) is agrees, (text, label, problem)
    if problem is not None:
        assert f"the tree {tree} is not that release: its version.txt" in problem
        for name in names:
            assert name in problem, (text, problem)
    from torchkiln.source.version import record

    kept = record("torch", tree, label)
    assert (kept.text, kept.label) == (text, label), "the file exactly as read, beside the label"


def test_a_version_file_that_is_no_text_is_refused_and_recorded_as_read(tmp_path: Path) -> None:
    from torchkiln.source.version import MAX_BYTES, record

    (tmp_path / "version.txt").write_bytes(b"2.13.0\xff\n")
    assert "is not UTF-8 text" in (label_problem("torch", tmp_path, "2.13.0") or "")
    assert record("torch", tmp_path, "2.13.0").text == "2.13.0\\xff\n"
    (tmp_path / "version.txt").write_bytes(b"2.13.0" + b" " * MAX_BYTES)
    assert f"longer than {MAX_BYTES} bytes" in (label_problem("torch", tmp_path, "2.13.0") or "")
    kept = record("torch", tmp_path, "2.13.0")
    assert kept.text is not None and len(kept.text) == MAX_BYTES and kept.sha256 is not None


def publish_build(tree: Path, root: Path, recipe_text: str, *, after: str | None = None):  # type: ignore[no-untyped-def]
    """A --source-dir build of ``tree``: the stand-in compile (test_tree_exact), an optional step that
    rewrites version.txt to ``after``, the real publish step; signed."""
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from test_tree_exact import stand_in_compile

    recipe = parse_recipe(recipe_text.encode(), "label-test.toml")
    plan = make_plan(
        recipe, workdir=root / "w", dist=root / "d", only="torch", source_dirs={"torch": tree},
        cache=resolve_cache(None, kind="none"),
    )  # fmt: skip
    compile_step = next(s for s in plan.steps if s.kind == "compile")
    (root / "made").mkdir(parents=True, exist_ok=True)
    wheel = tiny_wheel(root / "made", "torch", compile_step.env["PYTORCH_BUILD_VERSION"])
    steps = [stand_in_compile(compile_step, tree, wheel)]
    if after is not None:
        edit = (sys.executable, "-c", f"open({str(tree / 'version.txt')!r}, 'w').write({after!r})")
        steps.append(Step("late-edit", "env", "", edit))
    options = BuildOptions(
        console=Console(file=io.StringIO()),
        skip_postcheck=True,
        sign_key=ed25519.Ed25519PrivateKey.generate(),
        allow_unisolated=unisolated_signing_allowed(),
    )
    return run_build(replace(plan, steps=[*steps, plan.steps[-1]]), options)


EXT = (HERE / "data" / "ext-cpu-test.toml").read_text()


def plain_tree(root: Path) -> Path:
    from test_tree_exact import plain_tree as made

    return made(root)  # version.txt 2.13.0a0, setup.py, kiln/


AS_IS = EXT.replace(
    'local_version = "+cpu"', 'pytorch_build_version = "2.13.0rc1+cpu"\npytorch_build_number = 0'
)


@pytest.mark.parametrize(
    ("text", "recipe", "label", "reading"),
    [
        (
            "2.13.0a0\r\n",
            EXT,
            "2.13.0+cpu",
            "upstream's development marker a0 of release 2.13.0: labelled as that release",
        ),
        ("2.13.0  \n", EXT, "2.13.0+cpu", "the final release 2.13.0"),
        ("2.13.0rc1\n", AS_IS, "2.13.0rc1+cpu", "a release candidate (rc1): labelled as it is"),
    ],
    ids=["marker, CRLF", "final, trailing spaces", "release candidate labelled as it is"],
)
def test_the_records_carry_the_version_file_as_read_beside_the_label(
    tmp_path: Path, text: str, recipe: str, label: str, reading: str
) -> None:
    """The lock file, the manifest and the signed provenance (the source and each wheel's subject) keep
    version.txt exactly as read (its whitespace included), its sha256, the label and how they agree."""
    import hashlib
    import json

    from torchkiln.artifacts.signing import load_envelope

    tree = plain_tree(tmp_path)
    (tree / "version.txt").write_bytes(text.encode())
    result = publish_build(tree, tmp_path, recipe)
    want = {
        "file": "version.txt",
        "text": text,
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "label": label,
        "reading": reading,
    }
    lock = json.loads(result.lock.read_text())["sources"]["torch"]
    assert lock["version"] == want
    assert json.loads(result.manifest.read_text())["sources"]["torch"]["version"] == want
    assert result.provenance is not None
    statement = json.loads(load_envelope(result.provenance).payload)
    resolved = statement["predicate"]["buildDefinition"]["resolvedDependencies"]
    assert next(d for d in resolved if d["name"] == "torch")["annotations"]["version_file"] == want
    (subject,) = statement["subject"]
    assert subject["annotations"]["version_file"] == want and subject["annotations"]["version"] == label


def test_a_version_file_changed_after_the_compile_is_refused_at_publish(tmp_path: Path) -> None:
    """The compile checked 2.13.0a0; a later step makes the tree a release candidate: the build stops right
    after that step (the tree watch names it and the file) and nothing is published with a label the tree no
    longer states."""
    tree = plain_tree(tmp_path)
    with pytest.raises(BuildFailed) as refused:
        publish_build(tree, tmp_path, EXT, after="2.13.0rc1\n")
    message = str(refused.value)
    assert "changed: modified version.txt (content)" in message, message
    assert "nothing was published (dist/ is unchanged)" in message and refused.value.step == "late-edit"
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").iterdir())
