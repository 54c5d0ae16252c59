"""Wheels into dist/, atomically.

Wheels are built into ``<workdir>/wheelhouse/<project>`` and reach ``dist/`` only after the whole build and
its checks succeeded (the publish step), each copied under a temporary name inside dist/ and renamed
(:mod:`torchkiln.files.atomic`): a reader of dist/ sees either the complete wheel or none, also when the build is
interrupted half-way. Temporaries a killed process (SIGKILL cannot be caught) left are removed at the start
of the next build.

What a build published is read back with :func:`read_published`: the manifest beside the wheels, checked
against the directory (the runtime image installs exactly what it describes).
"""

from __future__ import annotations

from pathlib import Path

from torchkiln.errors import DocumentError, Problem, UsageError, few
from torchkiln.files import atomic
from torchkiln.files.atomic import PARTIAL_MARK, clean_partials
from torchkiln.files.digests import file_sha256

from . import wheelfile
from .manifest import Manifest, load_manifest

__all__ = ["PARTIAL_MARK", "clean_partials", "publish", "read_published", "remove_superseded", "wheels_in"]

MANIFEST_NAME = "manifest.json"
# The signed provenance statement of a recipe's build (torchkiln.artifacts.provenance): named here so that a
# build without a key finds an earlier statement without importing the signing machinery.
STATEMENT_SUFFIX = ".intoto.jsonl"


def statement_name(recipe_name: str) -> str:
    return f"{recipe_name}{STATEMENT_SUFFIX}"


def publish(source: Path, dist: Path) -> Path:
    """Copy ``source`` into ``dist`` under its own name, atomically (temporary name, fsync, os.replace).
    A copy, not a hard link: a later build rewriting the wheelhouse file must never touch dist/."""
    dist.mkdir(parents=True, exist_ok=True)
    return atomic.copy(source, dist / source.name)


def wheels_in(directory: Path) -> list[Path]:
    """The wheels in ``directory`` (sorted by name; none when it does not exist)."""
    return wheelfile.find([directory])


def remove_superseded(dist: Path, published: list[Path]) -> list[Path]:
    """Remove other wheels of the distributions just published (an older version or local label).

    dist/ then holds one wheel per project, the one the manifest lists: installing "the wheels in dist/"
    can never pick up a stale build. Wheels of other distributions are left alone.
    """
    names = {name.project for p in published if (name := wheelfile.parse(p.name)) is not None}
    keep = {p.name for p in published}
    removed = []
    for path in wheels_in(dist):
        name = wheelfile.parse(path.name)
        if path.name not in keep and name is not None and name.project in names:
            path.unlink()
            removed.append(path)
    return removed


def read_published(dist: Path) -> Manifest:
    """The manifest of what a build published into ``dist``, checked against the directory: every wheel it
    lists is there with the sha256 it records, and no other wheel is (one would be installed beside them
    without being described). A missing directory or manifest is a UsageError, a manifest that cannot be read
    or does not describe the directory a DocumentError, each naming the file (exit 2)."""
    if not dist.is_dir():
        raise UsageError(
            f"{dist}: no such directory (valid: a directory a build published into, e.g. the dist/ that "
            "`torchkiln build` fills)"
        )
    path = dist / MANIFEST_NAME
    if not path.is_file():
        present = few([p.name for p in wheels_in(dist)]) or "no wheels"
        raise UsageError(
            f"{path}: no such file ({dist} holds {present}); the manifest `torchkiln build` writes beside the "
            "wheels it publishes says which wheels they are, from which commits and which recipe"
        )
    manifest = load_manifest(path)
    file = str(path)
    listed = {record.name: record for record in manifest.wheels}
    problems = [
        Problem(file, "wheels", f"does not list {p.name}, which is in {dist}", "remove it, or build again")
        for p in wheels_in(dist)
        if p.name not in listed
    ]
    for index, (name, record) in enumerate(listed.items()):
        wheel = dist / name
        if not wheel.is_file():
            problems.append(
                Problem(file, f"wheels[{index}]", f"{name} is not in {dist}", "the wheels it lists")
            )
        elif file_sha256(wheel) != record.sha256:
            problems.append(
                Problem(
                    file,
                    f"wheels[{index}].sha256",
                    f"{name} in {dist} is not the wheel the build published (another sha256)",
                    "the published wheel, or build again",
                )
            )
    if problems:
        raise DocumentError(problems)
    return manifest
