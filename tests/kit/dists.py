"""Distributions for tests: tiny valid wheels (pip installs something real but small, offline), the
manifest a build would write for given wheels and sources, and the manifest that stands in for a build when
upstream's wheels take the place of torchkiln's (the runtime image tests)."""

from __future__ import annotations

import base64
import csv
import datetime as dt
import hashlib
import io
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from torchkiln import __version__
from torchkiln.artifacts import wheelfile
from torchkiln.artifacts.lockfile import SourceLock
from torchkiln.artifacts.manifest import (
    MANIFEST_FORMAT,
    Checks,
    Jobs,
    Manifest,
    RecipeInfo,
    WheelRecord,
    write_manifest,
)
from torchkiln.host.toolchain import Toolchain
from torchkiln.recipe.model import Recipe


def tiny_wheel(
    directory: Path,
    name: str,
    version: str,
    *,
    requires: tuple[str, ...] = (),
    files: dict[str, str | bytes] | None = None,
    tag: str = "py3-none-any",
    module: bool = True,
) -> Path:
    """A wheel ``name-version-<tag>.whl`` with one module (without ``module``: none, a package in ``files``
    instead) and ``files`` (paths inside the wheel, e.g. ``name-version.data/scripts/tool`` or a compiled
    ``name/_ext.so``), its METADATA, WHEEL and RECORD."""
    dist_info = f"{name}-{version}.dist-info"
    contents: dict[str, str | bytes] = {
        **({f"{name}.py": f"VERSION = {version!r}\n"} if module else {}),
        **(files or {}),
        f"{dist_info}/METADATA": "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: torchkiln-tests\n"
        f"Root-Is-Purelib: {'true' if tag.endswith('-any') else 'false'}\nTag: {tag}\n",
    }
    record = io.StringIO()
    rows = csv.writer(record, lineterminator="\n")  # RECORD is CSV: a path with a comma is quoted
    for path, text in contents.items():
        data = text.encode() if isinstance(text, str) else text
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")
        rows.writerow([path, f"sha256={digest}", len(data)])
    rows.writerow([f"{dist_info}/RECORD", "", ""])
    wheel = directory / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in contents.items():
            archive.writestr(path, text)
        archive.writestr(f"{dist_info}/RECORD", record.getvalue())
    return wheel


def pip_install_target(target: Path, *wheels: Path) -> Path:
    """``wheels`` installed by this interpreter's pip into ``target`` (``--target``: no venv), offline and
    without their dependencies, with no pip configuration file (a machine's constraints cannot reach it)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
        ]
        + [str(w) for w in wheels],
        check=True,
        capture_output=True,
        env={**os.environ, "PIP_CONFIG_FILE": os.devnull},
    )
    return target


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


_GIT_VERSION_RE = re.compile(r"""^git_version\s*=\s*['"]([0-9a-f]{7,40}|Unknown)['"]""", re.M)


def wheel_commit(path: Path, project: str) -> str:
    """The source commit a torch/torchvision wheel records in ``<project>/version.py`` (``git_version``)."""
    try:
        with zipfile.ZipFile(path) as zf:
            text = zf.read(f"{project}/version.py").decode("utf-8", "replace")
    except (KeyError, OSError, zipfile.BadZipFile):
        return ""
    match = _GIT_VERSION_RE.search(text)
    return match.group(1) if match and match.group(1) != "Unknown" else ""


def manifest_for_upstream(recipe: Recipe, dist: Path, origin: str) -> Path:
    """Write ``dist/manifest.json`` for the torch/torchvision wheels in ``dist`` that torchkiln did *not* build
    (upstream's, from ``origin``), so a runtime image can be made of them the way it is made of a build.

    It states only what is known, and says so: each wheel's name, version, size, sha256 and installed files
    (read from the file); as each project's source, the commit the wheel's ``version.py`` records, repository
    and ref unknown; the recipe that describes the wheels (tests/reference/recipes/); no steps, toolchain,
    build environment or cache, checks skipped, and a warning naming where the wheels came from.
    """
    wheels = [
        WheelRecord.of(path, project)
        for project in ("torch", "torchvision")
        for path in wheelfile.find([dist], project=project)
    ]
    sources = {
        w.project: SourceLock(
            w.project, None, None, wheel_commit(dist / w.name, w.project) or None, False, False, ""
        )
        for w in wheels
    }
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    manifest = Manifest(
        format=MANIFEST_FORMAT,
        torchkiln=__version__,
        started=now,
        finished=now,
        recipe=RecipeInfo.of(recipe),
        projects=[w.project for w in wheels],
        jobs=Jobs(0, "none", "not built by torchkiln"),
        sources=sources,
        toolchain=Toolchain(),
        build_env={},
        stages={},
        steps=[],
        cache=None,
        checks=Checks(skipped=True),
        wheels=wheels,
        warnings=[
            f"not built by torchkiln: {', '.join(w.name for w in wheels)} from {origin}; each source commit is "
            "the one its wheel's version.py records"
        ],
    )
    path = dist / "manifest.json"
    write_manifest(path, manifest)
    return path


def tampered_copy(source: Path, target: Path, member: str, data: bytes) -> Path:
    """``source`` with ``member`` replaced by ``data`` and RECORD made to match (a careful tamperer: pip
    installs it without complaint), written to ``target``."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            content = data if info.filename == member else zin.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = [
                    f"{member},sha256={digest},{len(data)}" if line.startswith(f"{member},") else line
                    for line in content.decode().splitlines()
                ]
                content = ("\n".join(lines) + "\n").encode()
            zout.writestr(info, content)
    return target
