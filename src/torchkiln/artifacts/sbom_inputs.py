"""What a wheel's SBOM is written from besides the wheel's own bytes, in one place (issue 38).

:func:`torchkiln.artifacts.sbom.wheel_sbom` reads the wheel, the manifest's sources, recipe, toolchain and
build environment (where the bundle step looked for libraries, the compiler whose search found the runtime
libraries it copied), the recipe, and its own code. A build keeps the SBOM it wrote under the digest of
those (:func:`sbom_inputs`, :mod:`torchkiln.build.sboms`) and writes the same file again from its record while
they are unchanged; the writer and the key take the derived ones (:func:`library_path_of`,
:func:`compiler_of`) from here. The invariant, tested on a table of changed manifests
(tests/test_sboms.py): **a kept SBOM is the SBOM writing it afresh gives**, but for its timestamp (the time
of the build that first published that wheel); the host's loader cache and dpkg database, where the origins of
bundled libraries are looked up, are read when the wheel's SBOM is first written. What the SBOM does not read
(the wheel's portability record, which the post-build check refines; the checks; the steps' times) is not in
the key: a build that only checked its wheel keeps its SBOM.

Light on purpose: no CycloneDX (a tenth of a second), which only a written SBOM imports.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass
from typing import Any

from torchkiln import __version__
from torchkiln.recipe.model import Recipe

from . import jsonfile
from .lockfile import Submodule
from .manifest import Manifest, WheelRecord


@dataclass(frozen=True)
class SbomSource:
    """What an SBOM says of the source a wheel was built from: its repository, ref and commit (a tree without
    git: its digest), whether the tree differed from that commit, and its submodules. Not where the tree was
    nor each path that differed: the manifest and the lock file say those. The writer reads a source only as
    this, and the key holds the same (tests/test_sboms.py); the build tools' paths are said (sbom_toolchain)."""

    repo: str | None
    ref: str | None
    commit: str | None
    tree_sha256: str | None
    dirty: bool
    submodules: tuple[Submodule, ...]


def sbom_source(manifest: Manifest, project: str) -> SbomSource | None:
    """What the SBOM of ``project``'s wheel says of its source; None when the manifest records none."""
    lock = manifest.sources.get(project)
    if lock is None:
        return None
    return SbomSource(lock.repo, lock.ref, lock.commit, lock.tree_sha256, lock.dirty, tuple(lock.submodules))


def library_path_of(manifest: Manifest) -> list[str]:
    """Where the bundle step looked first for libraries: the CUDA toolkit's lib64 of a CUDA build."""
    homes = {env.get("CUDA_HOME") for env in manifest.build_env.values()}
    return [f"{home}/lib64" for home in sorted(h for h in homes if h)]


def compiler_of(manifest: Manifest) -> str:
    """The C compiler torch's compile step ran with (its CC: build.gcc's ``gcc-12``), else this process's CC,
    else ``cc``: the one whose search the repair step asked for the runtime libraries."""
    return manifest.build_env.get("torch", {}).get("CC") or os.environ.get("CC") or "cc"


def sbom_inputs(
    record: WheelRecord, manifest: Manifest, recipe: Recipe | None, code: list[Any]
) -> dict[str, Any]:
    """Everything the SBOM of ``record``'s wheel is written from but the wheel (its sha256 names its bytes)
    and the time; ``code``: the identity of the code that writes it. JSON's types."""
    compiler = compiler_of(manifest)
    found = shutil.which(compiler.split()[0]) if compiler.split() else None
    return {
        # its record, but the portability the post-build check refines (which no SBOM says)
        "wheel": jsonfile.to_data(dataclasses.replace(record, portability=None)),
        "sources": {
            project: jsonfile.to_data(sbom_source(manifest, project)) for project in manifest.sources
        },
        "recipe": jsonfile.to_data(manifest.recipe),
        "recipe_sha256": recipe.sha256 if recipe is not None else None,
        "toolchain": jsonfile.to_data(manifest.toolchain),
        "library_path": library_path_of(manifest),
        # the compiler as PATH finds it: another compiler of the same name searches elsewhere
        "compiler": [compiler, os.path.realpath(found) if found else None],
        "code": [__version__, *code],
    }
