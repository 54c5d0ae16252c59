"""Wheel files: their names, finding them in directories, and the digest of what they install.

One reading of a wheel file name (``{distribution}-{version}(-{build})?-{python}-{abi}-{platform}.whl``,
the binary distribution format of PyPA's specifications) for everything that looks for wheels: publishing
into dist/, the post-build check (which runs in a clean venv, so this module is **standard library only**
and has no relative imports: ``postcheck.py`` loads it by path), the nox ``verify`` session and the
manifest.

:func:`record_digest` reduces a RECORD file to one sha256 over the files a wheel installs, in a form that
is the same for the wheel's own RECORD and for the RECORD pip leaves in site-packages (pip adds its own
files, bytecode and moves ``.data`` files; those are left out on both sides). The manifest records it per
wheel, so ``torchkiln verify --manifest`` can tell whether the installed files are the ones built.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_NAME_RE = re.compile(
    r"^(?P<distribution>[^-]+)-(?P<version>[^-]+)(?:-(?P<build>\d[^-]*))?"
    r"-(?P<python>[^-]+)-(?P<abi>[^-]+)-(?P<platform>[^-]+)\.whl$"
)
# Files pip writes into an installed distribution that no wheel carries.
INSTALLER_FILES = frozenset(
    {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD", "RECORD.jws", "RECORD.p7s"}
)


def project_key(name: str) -> str:
    """A project name normalised as PEP 503 does (``Torch_Vision`` -> ``torch-vision``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class WheelName:
    distribution: str  # as spelled in the file name (underscores)
    version: str
    build: str | None
    python: tuple[str, ...]  # "cp312", "py3", ...
    abi: tuple[str, ...]
    platform: tuple[str, ...]

    @property
    def project(self) -> str:
        return project_key(self.distribution)


def parse(filename: str) -> WheelName | None:
    """The parts of a wheel file name; None when ``filename`` is not one."""
    match = _NAME_RE.match(filename)
    if match is None:
        return None
    return WheelName(
        match["distribution"],
        match["version"],
        match["build"],
        tuple(match["python"].split(".")),
        tuple(match["abi"].split(".")),
        tuple(match["platform"].split(".")),
    )


def find(
    directories: Iterable[Path],
    *,
    project: str | None = None,
    version: str | None = None,
    python: str | None = None,
) -> list[Path]:
    """Wheels in ``directories`` (sorted by name, directories in order) of ``project`` at exactly
    ``version`` for the Python tag ``python`` (``cp312``; ``py3`` wheels match any CPython 3); each
    filter applies when given."""
    found: list[Path] = []
    for directory in directories:
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.whl")):
            name = parse(path.name)
            if name is None:
                continue
            if project is not None and name.project != project_key(project):
                continue
            if version is not None and name.version != version:
                continue
            if python is not None and not _python_matches(name.python, python):
                continue
            found.append(path)
    return found


def _python_matches(tags: tuple[str, ...], wanted: str) -> bool:
    return wanted in tags or (wanted.startswith("cp") and f"py{wanted[2:3]}" in tags)


def installed_path(path: str) -> str | None:
    """Where pip installs a wheel entry, relative to site-packages; None when outside it or pip's own."""
    parts = path.split("/")
    if parts[0].endswith(".data"):
        if len(parts) > 2 and parts[1] in ("purelib", "platlib"):
            return "/".join(parts[2:])
        return None  # scripts, headers, data: outside site-packages, and scripts are rewritten
    if path.startswith("../") or "__pycache__" in parts:
        return None
    if len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] in INSTALLER_FILES:
        return None
    return path


def record_digest(record: str) -> str:
    """sha256 over the ``path,hash`` entries of a RECORD that a wheel installs into site-packages, sorted,
    one per line. The same for a wheel's RECORD and the RECORD of its installation by pip."""
    entries = []
    for row in csv.reader(io.StringIO(record)):
        if len(row) < 2 or not row[1]:
            continue  # RECORD itself and bytecode carry no hash
        path = installed_path(row[0])
        if path is not None:
            entries.append(f"{path},{row[1]}")
    return hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()


def record_line(name: str, data: bytes) -> str:
    """The RECORD entry of a file a wheel carries: ``path,sha256=<urlsafe base64, unpadded>,size``."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def wheel_record(path: Path) -> str:
    """The RECORD file inside a wheel, as text."""
    with zipfile.ZipFile(path) as archive:
        name = next((n for n in archive.namelist() if n.endswith(".dist-info/RECORD")), None)
        if name is None:
            raise ValueError(f"{path}: no .dist-info/RECORD inside (not a wheel)")
        return archive.read(name).decode("utf-8")
