"""The published wheels' SBOMs, written only when what they say changed (issue 38).

Every build publishes (:mod:`torchkiln.build.publish`), a no-op included; writing an SBOM means importing
the CycloneDX library (a fifth of a second, more than the rest of a no-op's work) and looking up the origin of
every bundled library. An SBOM says what :func:`torchkiln.artifacts.sbom.wheel_sbom` reads, listed by
:func:`torchkiln.artifacts.sbom_inputs.sbom_inputs`: the wheel (its record but its portability), the
manifest's sources, recipe, toolchain and build environment, the recipe, and the code that writes it. Those,
digested, are the key of a record (:mod:`torchkiln.plan.records`, in the
work directory) of the SBOM file written for them and its sha256. When the key is unchanged and that file is
still in dist/ with that sha256, it is kept as it is: its timestamp stays that of the build that published
the wheel it describes, and the origins it gives for the bundled libraries stay those found when they were
bundled (the wheel holds those). The record keeps the SBOM's text too, in the work directory and the
environment store: another work directory's build of the same wheel from the same inputs (a fresh dist/)
gets the same SBOM written from it. Anything else writes it afresh.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from pathlib import Path

from torchkiln import artifacts
from torchkiln.artifacts.manifest import Manifest, WheelRecord
from torchkiln.artifacts.sbom_inputs import compiler_of, library_path_of, sbom_inputs
from torchkiln.files import atomic
from torchkiln.files.digests import file_sha256
from torchkiln.plan.records import Records, file_identity
from torchkiln.recipe.model import Recipe

# The code an SBOM is written with (in its key): torchkiln.artifacts.sbom, the modules split out of it (the
# image's too, as when it was one file) and sbom_inputs.
SBOM_CODE = [
    Path(artifacts.__file__).parent / name
    for name in (
        "sbom.py",
        "sbom_bundled.py",
        "sbom_debian.py",
        "sbom_image.py",
        "sbom_toolchain.py",
        "sbom_inputs.py",
    )
]


def _key(record: WheelRecord, manifest: Manifest, recipe: Recipe) -> str:
    """What the SBOM is written from (torchkiln.artifacts.sbom_inputs)."""
    return Records.key("sbom", sbom_inputs(record, manifest, recipe, [file_identity(f) for f in SBOM_CODE]))


def _kept(records: Records, key: str, dist: Path) -> Path | None:
    """The SBOM for ``key`` in ``dist``: the file there when it is the one recorded, else the recorded text
    written there (another work directory's dist/ of the same build); None when none is recorded."""
    answer = records.get(key)
    if not answer or not isinstance(answer.get("name"), str) or not isinstance(answer.get("text"), str):
        return None
    path: Path = dist / str(answer["name"])
    if path.is_file() and file_sha256(path) == answer.get("sha256"):
        return path
    atomic.write_text(path, str(answer["text"]))
    return path


def publish_sboms(dist: Path, manifest: Manifest, recipe: Recipe, records: Records) -> list[Path]:
    """An SBOM beside every wheel the manifest lists in ``dist``: the one recorded for the same inputs
    (the file there, or its text written there), else a new one (atomically). Their paths, in the
    manifest's order."""
    written: list[Path] = []
    for record in manifest.wheels:
        key = _key(record, manifest, recipe)
        path = _kept(records, key, dist)
        if path is None:
            from torchkiln.artifacts import sbom  # noqa: PLC0415 - CycloneDX only when an SBOM is written

            bom = sbom.wheel_sbom(
                dist / record.name,
                record,
                manifest,
                recipe,
                library_path=library_path_of(manifest),
                compiler=compiler_of(manifest),
            )
            path = sbom.write_sbom(dist / sbom.sbom_name(record.name), bom)
            text = path.read_text(encoding="utf-8")
            records.put(key, {"name": path.name, "sha256": file_sha256(path), "text": text})
        written.append(path)
    return written


def prefetch_writer() -> None:
    """Import the SBOM writer (CycloneDX: 0.08 s) in a thread beside a compile step, whose cores are mostly
    idle while its objects come from the cache: a build that writes an SBOM (a new wheel, or a work directory
    at another path, whose tools' paths the SBOM says) then does not wait for it at publish. Importing is
    idempotent; a build that keeps its SBOM only spent the import's CPU during the compile."""

    def load() -> None:
        with contextlib.suppress(Exception):  # a writer that fails to import fails at publish, saying why
            importlib.import_module("torchkiln.artifacts.sbom")

    threading.Thread(target=load, name="sbom-import", daemon=True).start()
