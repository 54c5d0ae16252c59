"""Wheels into dist/, atomically.

Wheels are built into ``<workdir>/wheelhouse/<project>`` and reach ``dist/`` only after the whole build and
its checks succeeded, each through a temporary name inside dist/ and ``os.replace`` (atomic on POSIX): a
reader of dist/ sees either the complete wheel or none, also when the build is interrupted (Ctrl-C, SIGTERM)
half-way. Temporaries carry the :data:`PARTIAL_MARK` prefix; any left by a killed process (SIGKILL cannot be
caught) are removed at the start of the next build.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from .fingerprint import file_sha256

PARTIAL_MARK = ".torchkiln-partial-"


@dataclass(frozen=True)
class WheelInfo:
    name: str
    project: str
    size: int
    sha256: str

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "project": self.project, "size": self.size, "sha256": self.sha256}


def wheel_info(path: Path, project: str) -> WheelInfo:
    return WheelInfo(path.name, project, path.stat().st_size, file_sha256(path))


def clean_partials(dist: Path) -> list[Path]:
    """Remove temporaries a killed build left in dist/. Returns what was removed."""
    removed = []
    if dist.is_dir():
        for path in dist.iterdir():
            if path.name.startswith(PARTIAL_MARK):
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def publish(source: Path, dist: Path) -> Path:
    """Copy ``source`` into ``dist`` under its own name, atomically (temporary name, fsync, os.replace)."""
    dist.mkdir(parents=True, exist_ok=True)
    final = dist / source.name
    tmp = dist / f"{PARTIAL_MARK}{os.getpid()}-{source.name}"
    try:
        # A copy, not a hard link: a later build rewriting the wheelhouse file must never touch dist/.
        shutil.copyfile(source, tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return final


def wheels_in(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.whl")) if directory.is_dir() else []


def _dist_name(path: Path) -> str | None:
    try:
        return canonicalize_name(parse_wheel_filename(path.name)[0])
    except InvalidWheelFilename:
        return None


def remove_superseded(dist: Path, published: list[Path]) -> list[Path]:
    """Remove other wheels of the distributions just published (an older version or local label).

    dist/ then holds one wheel per project, the one the manifest lists: installing "the wheels in dist/"
    can never pick up a stale build. Wheels of other distributions are left alone.
    """
    names = {_dist_name(p) for p in published} - {None}
    keep = {p.name for p in published}
    removed = []
    for path in wheels_in(dist):
        if path.name not in keep and _dist_name(path) in names:
            path.unlink()
            removed.append(path)
    return removed
