"""The manifest as a typed document, and ``verify --manifest``'s comparison of what is installed with it.

Real pip installs tiny real wheels (offline, ``--target``) so that what pip writes (its RECORD with bytecode
and its own files, ``direct_url.json``, scripts moved out of ``.data``) is what the digest must survive.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
from pathlib import Path

import pytest
from kit.dists import manifest_of, pip_install_target, source_lock, tiny_wheel
from kit.imagekit import need_torch
from packaging.version import Version

from torchkiln.artifacts.manifest import WheelRecord, load_manifest, write_manifest
from torchkiln.artifacts.wheelfile import record_digest, wheel_record
from torchkiln.cli import main
from torchkiln.errors import DocumentError
from torchkiln.files.digests import file_sha256
from torchkiln.host.toolchain import Tool, Toolchain
from torchkiln.verify import provenance
from torchkiln.verify.facts import BuildFacts, collect_facts

COMMIT = "a" * 40
# pip records the sha256 of a local wheel it installs (direct_url.json's archive_info) from 23.1 on; verify's
# wheel_sha256 check reads it. Debian 12's venv pip is 23.0.1: nox's sessions upgrade pip first.
PIP_RECORDING_HASHES = Version("23.1")


def pip_install(wheel: Path, target: Path) -> None:
    pip = Version(importlib.metadata.version("pip"))
    if pip < PIP_RECORDING_HASHES:
        pytest.fail(
            f"pip {pip} records no sha256 of the wheel it installs (direct_url.json), which these tests read; "
            f"pip >= {PIP_RECORDING_HASHES} does: upgrade this venv's pip (nox's sessions do)"
        )
    pip_install_target(target, wheel)


@pytest.fixture(scope="module")
def real_facts() -> BuildFacts:
    """The facts of the installed torch (the suite's torch 2.13.0 CPU wheel)."""
    need_torch()
    return collect_facts()


@pytest.fixture
def installed_kilnpkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """kilnpkg 1.0 (a module and a script under .data) installed by pip into a directory on sys.path."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = tiny_wheel(
        wheels, "kilnpkg", "1.0", files={"kilnpkg-1.0.data/scripts/kilntool": "#!python\nprint('hi')\n"}
    )
    site = tmp_path / "site"
    pip_install(wheel, site)
    monkeypatch.syspath_prepend(str(site))
    return wheel, site


def test_installed_files_digest_is_the_wheels(installed_kilnpkg: tuple[Path, Path]) -> None:
    """What pip adds (INSTALLER, REQUESTED, direct_url.json, bytecode) and moves (scripts) does not count."""
    wheel, site = installed_kilnpkg
    found = provenance.installed("kilnpkg")
    assert found is not None and found.version == "1.0"
    installed_record = next(site.glob("kilnpkg-1.0.dist-info")).joinpath("RECORD").read_text()
    assert installed_record != wheel_record(wheel), "pip rewrote RECORD"
    assert found.record_digest == record_digest(wheel_record(wheel))
    assert found.archive_sha256 == file_sha256(wheel), "pip names the wheel file it installed from"
    assert found.changed == []
    (site / "kilnpkg.py").write_text("VERSION = 'patched'\n")
    assert provenance.installed("kilnpkg").changed == ["kilnpkg.py"]  # type: ignore[union-attr]


def test_manifest_checks_pass_for_the_wheel_and_name_each_difference(
    installed_kilnpkg: tuple[Path, Path], real_facts: BuildFacts
) -> None:
    wheel, _ = installed_kilnpkg
    record = dataclasses.replace(WheelRecord.of(wheel, "torch"), project="kilnpkg")
    facts = dataclasses.replace(real_facts, git_version=COMMIT)
    good = manifest_of([record], {"kilnpkg": source_lock("kilnpkg", COMMIT)})
    results = provenance.manifest_checks(good, facts)
    # kilnpkg stands in for torch here only through its git_version (facts of "torch")
    assert {k: c.status for k, c in results.items()} == {
        "kilnpkg.version": "pass",
        "kilnpkg.commit": "skip",  # not torch or torchvision: no git_version to compare with
        "kilnpkg.wheel_sha256": "pass",
        "kilnpkg.files": "pass",
    }

    other = dataclasses.replace(record, version="1.1", sha256="0" * 64, files_sha256="1" * 64)
    failed = provenance.manifest_checks(manifest_of([other], {}), facts)
    assert {k: c.status for k, c in failed.items()} == {
        "kilnpkg.version": "fail",
        "kilnpkg.commit": "skip",
        "kilnpkg.wheel_sha256": "fail",
        "kilnpkg.files": "fail",
    }
    assert failed["kilnpkg.version"].message.startswith("manifest wheels[kilnpkg]: installed kilnpkg 1.0, ")
    assert f"the manifest's {record.name} has {'0' * 64}" in failed["kilnpkg.wheel_sha256"].message
    missing = dataclasses.replace(record, project="kilnabsent")
    assert {c.status for c in provenance.manifest_checks(manifest_of([missing], {}), facts).values()} == {
        "fail"
    }


def test_commits_come_from_the_manifests_sources(real_facts: BuildFacts) -> None:
    """The lock's commit is compared also when the recipe pinned none; a tree without a commit says so."""
    facts = dataclasses.replace(real_facts, git_version=COMMIT)
    checks = provenance.wheel_checks  # one project's checks, with what is installed taken as given
    here = provenance.Installed("torch", "2.13.0", "d", None)
    wheel = WheelRecord("torch-2.13.0-cp311-cp311-linux_x86_64.whl", "torch", "2.13.0", 1, "s", "d")
    assert checks(wheel, here, facts.git_version, COMMIT, None)["commit"].status == "pass"
    wrong = checks(wheel, here, facts.git_version, "c" * 40, None)["commit"]
    assert wrong.status == "fail" and f"the manifest's source commit is {'c' * 40}" in wrong.message
    tree = checks(wheel, here, "Unknown", None, "e" * 64)["commit"]
    assert tree.status == "skip" and f"its source had no commit (tree sha256 {'e' * 64})" in tree.message


def test_manifest_round_trips_and_a_bad_one_names_its_field(tmp_path: Path) -> None:
    record = WheelRecord("torch-1.0-py3-none-any.whl", "torch", "1.0", 10, "s" * 64, "f" * 64)
    manifest = manifest_of(
        [record],
        {"torch": source_lock("torch", COMMIT)},
        Toolchain("3.11.7", {"g++": Tool("/usr/bin/c++", "12.2.0", "c++")}),
    )
    path = tmp_path / "manifest.json"
    write_manifest(path, manifest)
    assert load_manifest(path) == manifest
    data = json.loads(path.read_text())
    data["wheels"][0]["size"] = "ten"
    del data["toolchain"]["tools"]["g++"]["version"]
    path.write_text(json.dumps(data))
    with pytest.raises(DocumentError) as info:
        load_manifest(path)
    assert str(info.value).splitlines() == [
        f"{path}: toolchain.tools.g++.version: missing (valid: a string or null)",
        f"{path}: wheels[0].size: expected an integer, got a string",
    ]
    data["format"] = 1
    path.write_text(json.dumps(data))
    with pytest.raises(DocumentError, match=r"format: manifest format 1 is not the one this torchkiln reads"):
        load_manifest(path)


def test_verify_refuses_a_bad_manifest_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify", "--manifest", str(tmp_path / "nope.json")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nope.json'}: <file>: no such file" in err and "Traceback" not in err
