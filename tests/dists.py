"""Distributions for tests: tiny valid wheels (pip installs something real but small, offline), and the
manifest a build would write for given wheels and sources."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

from torchkiln.lock import SourceLock
from torchkiln.manifest import MANIFEST_FORMAT, Checks, Jobs, Manifest, RecipeInfo, WheelRecord
from torchkiln.toolchain import Toolchain


def tiny_wheel(
    directory: Path,
    name: str,
    version: str,
    *,
    requires: tuple[str, ...] = (),
    files: dict[str, str] | None = None,
) -> Path:
    """A pure-Python wheel ``name-version-py3-none-any.whl`` with one module (and ``files``, paths inside
    the wheel, e.g. ``name-version.data/scripts/tool``), its METADATA, WHEEL and RECORD."""
    dist_info = f"{name}-{version}.dist-info"
    contents = {
        f"{name}.py": f"VERSION = {version!r}\n",
        **(files or {}),
        f"{dist_info}/METADATA": "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: torchkiln-tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for path, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).decode().rstrip("=")
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist_info}/RECORD,,")
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in contents.items():
            archive.writestr(path, text)
        archive.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return wheel


def manifest_of(
    wheels: list[WheelRecord], sources: dict[str, SourceLock], toolchain: Toolchain | None = None
) -> Manifest:
    """A manifest listing ``wheels`` built from ``sources`` (the other fields: placeholders)."""
    return Manifest(
        format=MANIFEST_FORMAT,
        torchkiln="0.1.0",
        started="2026-11-22T00:00:00+00:00",
        finished="2026-11-22T01:00:00+00:00",
        recipe=RecipeInfo(
            "r", None, "ab" * 32, wheels[0].version if wheels else "", "", "3.11", "cpu", None, []
        ),
        projects=sorted(sources),
        jobs=Jobs(2, "auto", "2 cores"),
        sources=sources,
        toolchain=toolchain or Toolchain(),
        build_env={},
        stages={},
        steps=[],
        cache=None,
        checks=Checks(skipped=True),
        wheels=wheels,
    )


def source_lock(name: str, commit: str | None, tree: str | None = None) -> SourceLock:
    """A ``--source-dir`` tree at ``commit`` (or, without one, known by its contents' sha256 ``tree``)."""
    return SourceLock(name, None, None, commit, commit is None, True, f"/src/{name}", tree)
