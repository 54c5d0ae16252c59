"""A build keeps a wheel's SBOM while what it is written from is unchanged (torchkiln.build.sboms, issue 38).

The invariant (torchkiln.artifacts.sbom_inputs): what a build publishes, kept or written, is the SBOM writing
it afresh gives (:func:`torchkiln.artifacts.sbom.write_wheel_sboms`, the oracle), but for its timestamp. It is
checked on a table of manifests changed one field at a time from the one first published: each change the SBOM
reads must write it again; each it does not read (the portability the post-build check refines, the checks,
the steps' times) must keep it, with the first build's timestamp. A tiny torch wheel with requirements, a real
recipe, the host's loader cache.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from kit import ROOT
from kit.dists import manifest_of, tiny_wheel

from torchkiln.artifacts import sbom
from torchkiln.artifacts.lockfile import SourceLock, Submodule, TreeChange, TreeLink, VersionRecord
from torchkiln.artifacts.manifest import Checks, Manifest, WheelRecord
from torchkiln.artifacts.portability import Portability
from torchkiln.artifacts.sbom_inputs import SbomSource
from torchkiln.build.sboms import publish_sboms
from torchkiln.host.toolchain import Tool, Toolchain
from torchkiln.plan.records import Records
from torchkiln.recipe.loader import load_recipe
from torchkiln.recipe.model import Recipe

RECIPES = [ROOT / "recipes" / "torch-2.13-cu130-py312.toml", ROOT / "recipes" / "torch-2.13-cpu-py311.toml"]
FIRST, LATER = "2026-11-22T01:00:00+00:00", "2026-11-23T09:30:00+00:00"


def _base(dist: Path) -> Manifest:
    wheel = tiny_wheel(dist, "torch", "2.13.0", requires=("numpy", "nvidia-cudnn-cu13==9.20.0.48"))
    lock = SourceLock(
        "torch", "https://github.com/pytorch/pytorch.git", "v2.13.0", "a" * 40, False, False, "/s"
    )
    chain = Toolchain(
        "3.12.8",
        {"g++": Tool("/usr/bin/c++", "12.2.0", "c++"), "cmake": Tool("/w/venv/bin/cmake", "4.1.0", "cmake")},
        cudnn="9.20.0",
        build_packages={"setuptools": "80.9.0"},
    )
    record = dataclasses.replace(WheelRecord.of(wheel, "torch", "3.12"), portability=Portability("unpacked"))
    return dataclasses.replace(manifest_of([record], {"torch": lock}, chain), finished=FIRST)


def _wheel(m: Manifest, **changes: object) -> Manifest:
    return dataclasses.replace(m, wheels=[dataclasses.replace(m.wheels[0], **changes)])


def _tool_moved(m: Manifest) -> Manifest:
    tools = {**m.toolchain.tools, "cmake": Tool("/elsewhere/venv/bin/cmake", "4.1.0", "cmake")}
    return dataclasses.replace(m, toolchain=dataclasses.replace(m.toolchain, tools=tools))


# Another value for every field of a project's SourceLock: the ones an SBOM says (sbom_inputs.SbomSource) must
# write it again; the others (the tree's path, each path that differed, its version file) must keep it. A field
# SourceLock gains fails test_source_fields_are_all_classified until it is classified here.
OTHER_SOURCE = {
    "name": "torch-fork",
    "repo": "https://example.org/fork/pytorch.git",
    "ref": "v2.13.1",
    "commit": "c" * 40,
    "dirty": True,
    "provided": True,
    "path": "/elsewhere/deeper/b1/vision",
    "tree_sha256": "d" * 64,
    "submodules": [Submodule("third_party/pybind11", "e" * 40, "https://example.org/pybind11.git", "ok")],
    "changed": ["setup.py"],
    "tree_changes": [TreeChange("setup.py", "modified", "f" * 64)],
    "outside_links": [TreeLink("third_party/x", "/opt/x")],
    "version": VersionRecord("version.txt", "2.13.0a0", "0" * 64, "2.13.0", "matches"),
}
SAID = {f.name for f in dataclasses.fields(SbomSource)}


def test_source_fields_are_all_classified() -> None:
    assert set(OTHER_SOURCE) == {f.name for f in dataclasses.fields(SourceLock)}


def _source(*fields: str) -> Callable[[Manifest], Manifest]:
    """The manifest with ``fields`` of torch's source given their OTHER_SOURCE values."""

    def change(m: Manifest) -> Manifest:
        lock = dataclasses.replace(m.sources["torch"], **{field: OTHER_SOURCE[field] for field in fields})
        return dataclasses.replace(m, sources={"torch": lock})

    return change


# (what changed, the change, whether the SBOM reads it)
VARIANTS: list[tuple[str, Callable[[Manifest], Manifest], bool]] = [
    *((f"the source's {name}", _source(name), name in SAID) for name in OTHER_SOURCE),
    ("every source field the SBOM does not say", _source(*(n for n in OTHER_SOURCE if n not in SAID)), False),
    ("the post-build check refined the portability", lambda m: _wheel(m, portability=Portability("installed")), False),
    ("the checks ran", lambda m: dataclasses.replace(m, checks=Checks(torch="2.13.0")), False),
    ("the steps took other times", lambda m: dataclasses.replace(m, stages={"torch:wheel": 3.0}), False),
    ("nothing", lambda m: m, False),
    ("a tool at another path", _tool_moved, True),
    ("another build package", lambda m: dataclasses.replace(
        m, toolchain=dataclasses.replace(m.toolchain, build_packages={"setuptools": "81.0.0"})), True),
    ("another cuDNN found", lambda m: dataclasses.replace(
        m, toolchain=dataclasses.replace(m.toolchain, cudnn="9.21.0")), True),
    ("another recipe name", lambda m: dataclasses.replace(
        m, recipe=dataclasses.replace(m.recipe, name="other")), True),
    ("a CUDA home for bundled libraries", lambda m: dataclasses.replace(
        m, build_env={"torch": {"CUDA_HOME": "/opt/cuda-13.0"}}), True),
    ("torch compiled with another CC", lambda m: dataclasses.replace(
        m, build_env={"torch": {"CC": "gcc-12"}}), True),
    ("another wheel of the same name", lambda m: _wheel(m, sha256="f" * 64), True),
]  # fmt: skip


def _without_time(path: Path) -> dict:
    data = json.loads(path.read_text())
    data["metadata"].pop("timestamp")
    return data


@pytest.mark.parametrize("recipe_file", RECIPES, ids=lambda p: p.stem)
@pytest.mark.parametrize(("change", "reads"), [(v[1], v[2]) for v in VARIANTS], ids=[v[0] for v in VARIANTS])
def test_a_kept_sbom_is_what_writing_it_afresh_gives(
    tmp_path: Path, recipe_file: Path, change: Callable[[Manifest], Manifest], reads: bool
) -> None:
    recipe: Recipe = load_recipe(recipe_file)
    dist, fresh = tmp_path / "dist", tmp_path / "fresh"
    dist.mkdir()
    records = Records.for_build(tmp_path / "work", tmp_path / "store")
    base = _base(dist)
    (first,) = publish_sboms(dist, base, recipe, records)
    assert json.loads(first.read_text())["metadata"]["timestamp"].startswith("2026-11-22T01:00:00")
    changed = dataclasses.replace(change(base), finished=LATER)
    (published,) = publish_sboms(dist, changed, recipe, records)
    fresh.mkdir()
    shutil.copy2(dist / base.wheels[0].name, fresh)
    (oracle,) = sbom.write_wheel_sboms(fresh, changed, recipe)
    assert _without_time(published) == _without_time(oracle)
    written_at = json.loads(published.read_text())["metadata"]["timestamp"]
    assert written_at.startswith("2026-11-23T09:30:00" if reads else "2026-11-22T01:00:00"), (
        "written again" if not reads else "kept though what it says changed"
    )


def test_another_work_directory_writes_the_recorded_sbom_into_its_fresh_dist(tmp_path: Path) -> None:
    """The store's record: a fresh dist/ of the same build gets the same file, not one written anew."""
    recipe = load_recipe(RECIPES[0])
    first, second = tmp_path / "a" / "dist", tmp_path / "b" / "dist"
    first.mkdir(parents=True)
    base = _base(first)
    (kept,) = publish_sboms(
        first, base, recipe, Records.for_build(tmp_path / "a" / "work", tmp_path / "store")
    )
    second.mkdir(parents=True)
    shutil.copy2(first / base.wheels[0].name, second)
    later = dataclasses.replace(base, finished=LATER)
    (again,) = publish_sboms(
        second, later, recipe, Records.for_build(tmp_path / "b" / "work", tmp_path / "store")
    )
    assert again.read_bytes() == kept.read_bytes()


def test_an_sbom_says_when_the_tree_built_differed_from_its_commit(tmp_path: Path) -> None:
    """The commit an SBOM names is what the wheel was built from only with the tree's changes: it says so."""
    recipe = load_recipe(RECIPES[0])
    names = {}
    for dirty in (False, True):
        dist = tmp_path / str(dirty)
        dist.mkdir()
        base = _base(dist)
        manifest = dataclasses.replace(
            base, sources={"torch": dataclasses.replace(base.sources["torch"], dirty=dirty)}
        )
        (written,) = sbom.write_wheel_sboms(dist, manifest, recipe)
        props = json.loads(written.read_text())["metadata"]["component"]["properties"]
        names[dirty] = {p["name"]: p["value"] for p in props}
    assert names[False]["torchkiln:commit"] == names[True]["torchkiln:commit"] == "a" * 40
    assert "torchkiln:tree-differs-from-commit" not in names[False]
    assert names[True]["torchkiln:tree-differs-from-commit"] == "true"
