"""`torchkiln reproduce` without a build (torchkiln.artifacts.record, .wheeldiff, torchkiln.plan.rebuild,
torchkiln.commands.reproduce's refusals): what a record says a rebuild needs, read the same from a manifest
and from a signed statement; which members of two wheels differ, on a real ELF file (this interpreter's own
binary) whose sections are changed in place; every input checked against the record before anything runs.
The rebuilds themselves: tests/test_reproduce.py.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from elftools.elf.elffile import ELFFile
from kit import ROOT
from kit.dists import manifest_of, tiny_wheel

from torchkiln import cli
from torchkiln.artifacts import provenance, signing
from torchkiln.artifacts.lockfile import SourceLock, Submodule
from torchkiln.artifacts.manifest import GivenTorchRecord, Rebuild, WheelRecord, write_manifest
from torchkiln.artifacts.record import RecordedSource, RecordedWheel, load_record
from torchkiln.artifacts.wheeldiff import compare, diff_wheels, report_lines
from torchkiln.errors import UsageError
from torchkiln.files.digests import tree_sha256
from torchkiln.plan import rebuild
from torchkiln.plan.make import make_plan
from torchkiln.recipe.loader import load_recipe

HERE = ROOT / "tests"
RECIPE = HERE / "data" / "ext-cpu-test.toml"
COMMIT, SUB = "c" * 40, "d" * 40
WHEEL = "kiln_repro-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"


def _zip(path: Path, members: dict[str, bytes], stamp: tuple[int, ...] = (2024, 1, 2, 3, 4, 6)) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            info = zipfile.ZipInfo(name, date_time=stamp)
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    return path


def _patched_elf(source: Path, section: str) -> bytes:
    """``source``'s bytes with one byte in the middle of ``section`` changed."""
    data = bytearray(source.read_bytes())
    with source.open("rb") as handle:
        header = ELFFile(handle).get_section_by_name(section).header
    at = header["sh_offset"] + header["sh_size"] // 2
    data[at] ^= 0xFF
    return bytes(data)


def test_differing_members_are_named_elf_ones_by_section(tmp_path: Path) -> None:
    elf = Path(sys.executable).resolve()  # a real ELF executable with .text and .rodata
    original = elf.read_bytes()
    a = _zip(
        tmp_path / "a.whl",
        {
            "pkg/_c.so": original,
            "pkg/_d.so": original,
            "pkg/stamp.txt": b"built at 10:00\nsame\n",
            "pkg/same.py": b"x = 1\n",
            "pkg/gone.py": b"",
            "pkg-1.dist-info/RECORD": b"pkg/_c.so,sha256=a,1\npkg/stamp.txt,sha256=b,2\npkg/same.py,sha256=c,3\n",
        },
    )
    b_dir = tmp_path / "b"
    b_dir.mkdir()
    b = _zip(
        b_dir / "a.whl",
        {
            "pkg/_c.so": _patched_elf(elf, ".rodata"),
            "pkg/_d.so": _patched_elf(elf, ".text"),
            "pkg/stamp.txt": b"built at 10:01\nsame\n",
            "pkg/same.py": b"x = 1\n",
            "pkg/new.py": b"",
            "pkg-1.dist-info/RECORD": b"pkg/_c.so,sha256=z,1\npkg/stamp.txt,sha256=y,2\npkg/same.py,sha256=c,3\n",
        },
    )
    found = {d.member: (d.kind, d.detail) for d in diff_wheels(a, b)}
    assert found.pop("pkg/_c.so") == ("content", "ELF sections differ: .rodata (bytes)")
    assert found.pop("pkg/_d.so") == ("content", "ELF sections differ: .text (bytes)")
    assert found.pop("pkg/stamp.txt") == ("content", "line 1: 'built at 10:00' -> 'built at 10:01'")
    assert found.pop("pkg/gone.py")[0] == "only-recorded" and found.pop("pkg/new.py")[0] == "only-rebuilt"
    assert found.pop("pkg-1.dist-info/RECORD") == (
        "content",
        "lists other digests or sizes for: pkg/_c.so, pkg/stamp.txt",
    )
    assert found == {}, "pkg/same.py is the same"


def test_same_bytes_in_another_zip_entry_is_named_by_what_differs(tmp_path: Path) -> None:
    members = {"pkg/a.py": b"a\n", "pkg/b.py": b"b\n"}
    a = _zip(tmp_path / "a.whl", members)
    b = _zip(tmp_path / "b.whl", members, stamp=(2025, 5, 6, 7, 8, 10))
    assert {(d.member, d.detail) for d in diff_wheels(a, b)} == {
        ("pkg/a.py", "timestamp 2024-01-02 03:04:06 -> 2025-05-06 07:08:10"),
        ("pkg/b.py", "timestamp 2024-01-02 03:04:06 -> 2025-05-06 07:08:10"),
    }
    c = _zip(tmp_path / "c.whl", dict(reversed(members.items())))
    assert [(d.member, d.detail) for d in diff_wheels(a, c)] == [
        ("<archive>", "the members are in another order")
    ]


def test_compare_says_same_differs_missing_extra_and_needs_the_recorded_wheel_to_explain(
    tmp_path: Path,
) -> None:
    recorded_dir, rebuilt_dir = tmp_path / "recorded", tmp_path / "rebuilt"
    recorded_dir.mkdir()
    rebuilt_dir.mkdir()
    same = tiny_wheel(recorded_dir, "same", "1.0")
    shutil.copy(same, rebuilt_dir)
    old = tiny_wheel(recorded_dir, "moved", "1.0")
    (rebuilt_dir / "x").mkdir()
    new = tiny_wheel(rebuilt_dir / "x", "moved", "1.0", files={"moved/extra.txt": "x"})
    extra = tiny_wheel(rebuilt_dir, "extra", "1.0")
    digest = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (same, old)}
    recorded = [
        RecordedWheel(same.name, digest[same.name], "torch"),
        RecordedWheel(old.name, digest[old.name], "torch"),
        RecordedWheel("gone-1.0-py3-none-any.whl", "0" * 64, "torchvision"),
    ]
    verdicts = {v.name: v for v in compare(recorded, [rebuilt_dir / same.name, new, extra], [recorded_dir])}
    assert verdicts[same.name].same
    moved = verdicts[old.name]
    assert moved.status == "differs" and {m.member for m in moved.members} == {
        "moved-1.0.dist-info/RECORD",
        "moved/extra.txt",
    }
    assert verdicts["gone-1.0-py3-none-any.whl"].status == "missing"
    assert verdicts[extra.name].status == "extra"
    lines = list(report_lines(list(verdicts.values())))
    assert any(line.startswith(f"DIFFERS   {old.name}") for line in lines)
    assert "  moved/extra.txt: not in the recorded wheel" in lines
    unexplained = compare(recorded[1:2], [new], [tmp_path / "nowhere"])[0]
    assert unexplained.status == "differs" and "not at hand" in unexplained.note
    impostor = tmp_path / "impostor"
    impostor.mkdir()
    tiny_wheel(impostor, "moved", "1.0", files={"other.txt": "o"})
    assert "is not the recorded wheel" in compare(recorded[1:2], [new], [impostor])[0].note


def _manifest(tmp_path: Path, *, tree: bool = False):
    recipe = load_recipe(RECIPE)
    wheel = WheelRecord(WHEEL, "torch", "2.13.0+cpu", 10, "ab" * 32, "cd" * 32)
    if tree:
        lock = SourceLock("torch", None, None, None, True, True, "/given/torch", "ef" * 32)
    else:
        subs = [Submodule("third_party/x", SUB, "file:///x", "ok")]
        lock = SourceLock(
            "torch", "file:///repos/torch", "main", COMMIT, False, False, "/w/src/torch", None, subs
        )
    manifest = manifest_of([wheel], {"torch": lock})
    recipe_info = replace(manifest.recipe, path=str(RECIPE), sha256=recipe.sha256, name=recipe.name)
    build_env = {"torch": {"VIRTUAL_ENV": "/w/venv", "SOURCE_DATE_EPOCH": "1700000000"}}
    given = GivenTorchRecord("/wheels/torch-2.6.0-cp311-cp311-linux_x86_64.whl", "12" * 32)
    outputs = {"torch": ["kiln_repro/version.py"]} if tree else {}
    return replace(
        manifest,
        recipe=recipe_info,
        build_env=build_env,
        rebuild=Rebuild({"torch": 1700000000}, outputs, given, "ccache"),
    )


@pytest.mark.parametrize("tree", [False, True], ids=["fetched", "tree"])
def test_a_manifest_and_its_signed_statement_record_the_same_rebuild(tmp_path: Path, tree: bool) -> None:
    manifest = _manifest(tmp_path, tree=tree)
    path = tmp_path / "manifest.json"
    write_manifest(path, manifest)
    key = ed25519.Ed25519PrivateKey.generate()
    data = provenance.statement(
        manifest,
        parameters={"projects": ["torch"], "workdir": "/w", "cache": {"kind": "ccache"}},
        byproducts=[path],
    )
    statement = tmp_path / "r.intoto.jsonl"
    provenance.write_signed(statement, data, key)
    from_manifest = load_record(path)
    from_statement = load_record(statement, key.public_key())
    assert from_statement.signature and from_statement.signature.startswith("signed by keyid")
    for field in (
        "recipe_name",
        "recipe_path",
        "recipe_sha256",
        "projects",
        "sources",
        "epochs",
        "torch",
        "wheels",
        "workdir",
        "cache",
    ):
        assert getattr(from_manifest, field) == getattr(from_statement, field), field
    source = from_manifest.sources["torch"]
    if tree:
        assert (source.commit, source.tree_sha256, source.tree_outputs) == (
            None,
            "ef" * 32,
            ["kiln_repro/version.py"],
        )
    else:
        assert (source.repo, source.ref, source.commit) == ("file:///repos/torch", "main", COMMIT)
        assert source.submodules == {"third_party/x": SUB}
    assert from_manifest.epochs == {"torch": 1700000000} and from_manifest.cache == "ccache"
    assert from_manifest.torch == GivenTorchRecord(
        "/wheels/torch-2.6.0-cp311-cp311-linux_x86_64.whl", "12" * 32
    )
    with pytest.raises(UsageError, match="not signed by the given key"):
        load_record(statement, ed25519.Ed25519PrivateKey.generate().public_key())


def test_a_manifest_from_before_issue_35_takes_the_epochs_from_its_build_env(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    write_manifest(path, replace(_manifest(tmp_path), rebuild=None))
    record = load_record(path)
    assert record.epochs == {"torch": 1700000000} and record.torch is None


def test_every_input_is_checked_against_the_record_before_anything_runs(tmp_path: Path) -> None:
    recipe = load_recipe(RECIPE)
    record = load_record(_written(tmp_path, _manifest(tmp_path)))
    rebuild.check_recipe(record, recipe)
    other = tmp_path / "other.toml"
    other.write_text(RECIPE.read_text() + "\n# changed\n")
    with pytest.raises(UsageError, match=r"sha256 [0-9a-f]{64} is not the recorded recipe's"):
        rebuild.check_recipe(record, load_recipe(other))
    pinned = rebuild.pinned_recipe(recipe, [record.sources["torch"]])
    assert (pinned.torch.repo, pinned.torch.ref, pinned.torch.commit) == (
        "file:///repos/torch",
        COMMIT,
        COMMIT,
    )
    assert pinned.torchvision == recipe.torchvision
    dirty = replace(record.sources["torch"], changed=["a.c", "b.c"])
    with pytest.raises(
        UsageError, match=r"torch: built from /w/src/torch with 2 file\(s\) that differ .*a.c, b.c"
    ):
        rebuild.refuse_changed(dirty)
    plan = rebuild.pin_epochs(
        make_plan(
            recipe, workdir=tmp_path / "w", dist=tmp_path / "d", only="torch", source_dirs={"torch": tmp_path}
        ),
        {"torch": 1700000000},
    )
    (compile_step,) = [s for s in plan.steps if s.kind == "compile"]
    assert compile_step.env["SOURCE_DATE_EPOCH"] == "1700000000"
    assert rebuild.accepted_versions(record, recipe) == frozenset()
    renamed = replace(record, wheels=[RecordedWheel(WHEEL.replace("2.13.0", "2.13.1"), "ab" * 32, "torch")])
    assert rebuild.accepted_versions(renamed, recipe) == frozenset({"torch"})


def _written(tmp_path: Path, manifest) -> Path:
    path = tmp_path / "manifest.json"
    write_manifest(path, manifest)
    return path


def test_a_given_tree_must_have_the_recorded_digest_and_is_copied_without_its_build_outputs(
    tmp_path: Path,
) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(HERE / "data" / "repro_project", tree)
    (tree / "kiln_repro" / "version.py").write_text("written by the build\n")
    (tree / "build").mkdir()
    (tree / "build" / "stale.o").write_text("a first build's object")
    digest = tree_sha256(tree, ["kiln_repro/version.py"])
    source = RecordedSource(
        "torch", None, None, None, digest, True, str(tree), tree_outputs=["kiln_repro/version.py"]
    )
    copy = rebuild.given_tree(source, tree, tmp_path / "copy")
    assert tree_sha256(copy) == digest
    # what the build recorded writing is left out; anything else is part of the tree, build/ included (a
    # planted build/ file must be in the digest: torchkiln.files.digests.tree_sha256)
    assert not (copy / "kiln_repro" / "version.py").exists()
    assert (copy / "build" / "stale.o").read_text() == "a first build's object"
    (tree / "setup.py").write_text((tree / "setup.py").read_text() + "# edited\n")
    with pytest.raises(
        UsageError, match=r"--source-dir torch=.*: its files' sha256 is [0-9a-f]{64}, the record's tree is"
    ):
        rebuild.given_tree(source, tree, tmp_path / "copy2")


def test_a_given_checkout_must_be_at_the_recorded_commit_and_is_cleaned(tmp_path: Path) -> None:
    tree = tmp_path / "repo"
    shutil.copytree(HERE / "data" / "repro_project", tree)
    git = ["git", "-c", "user.name=k", "-c", "user.email=k@k", "-C", str(tree)]
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    (tree / "build").mkdir()
    (tree / "build" / "stale.o").write_text("a first build's object")
    source = RecordedSource("torch", None, None, head, None, True, str(tree))
    copy = rebuild.given_tree(source, tree, tmp_path / "copy")
    assert not (copy / "build").exists() and (copy / "setup.py").is_file()
    with pytest.raises(UsageError, match=rf"HEAD is {head}, the record's commit is {'e' * 40}"):
        rebuild.given_tree(replace(source, commit="e" * 40), tree, tmp_path / "copy2")
    (tree / "setup.py").write_text("# changed\n")
    with pytest.raises(UsageError, match=r"1 tracked file\(s\) differ from commit .*setup.py"):
        rebuild.given_tree(source, tree, tmp_path / "copy3")


def test_reproduce_refuses_unusable_input_with_exit_2_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _written(tmp_path, _manifest(tmp_path))
    workdir = tmp_path / "again"
    changed = tmp_path / "changed.toml"
    changed.write_text(RECIPE.read_text() + "\n")
    assert cli.main(["reproduce", str(path), "--recipe", str(changed), "--workdir", str(workdir)]) == 2
    assert "not the recorded recipe's" in capsys.readouterr().err
    workdir.mkdir()
    (workdir / "left").write_text("x")
    assert cli.main(["reproduce", str(path), "--workdir", str(workdir)]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert cli.main(["reproduce", str(tmp_path / "nothing.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    key = tmp_path / "k.pub"
    key.write_bytes(signing.public_pem(ed25519.Ed25519PrivateKey.generate()))
    assert cli.main(["reproduce", str(path), "--key", str(key), "--workdir", str(tmp_path / "w3")]) == 2
    assert "is a manifest, not a signed statement" in capsys.readouterr().err


def test_an_only_torchvision_record_without_its_torch_at_hand_asks_for_it(tmp_path: Path) -> None:
    """A --only torchvision build without --torch took torch from dist/: the rebuild looks for that wheel
    (the build venv's torch version) beside the record, and says what to give when it is not there."""
    import argparse

    from torchkiln.commands.reproduce import _given_torch

    record = load_record(_written(tmp_path, _manifest(tmp_path)))
    record = replace(record, torch=None, build_packages={"torch": "2.13.0+cpu"})
    args = argparse.Namespace(given_torch=None)
    with pytest.raises(
        UsageError, match=r"built against torch 2.13.0\+cpu, and no wheel of it is beside the record"
    ):
        _given_torch(args, record, load_recipe(RECIPE), "torchvision", [tmp_path])
    assert _given_torch(args, record, load_recipe(RECIPE), "torch", [tmp_path]) is None


def test_a_refused_input_leaves_no_work_directory_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _written(tmp_path, _manifest(tmp_path, tree=True))  # its tree, /given/torch, is not there
    workdir = tmp_path / "again"
    assert cli.main(["reproduce", str(path), "--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err
    assert "--source-dir torch=/given/torch: not a directory (valid: --source-dir torch=PATH" in err
    assert not workdir.exists()
