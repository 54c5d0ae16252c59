"""Installed distributions as the loader sees them: their files (RECORD), what each declares (Requires-Dist),
and the ELF files and shared libraries among them.

A wheel's libraries are judged from where pip installs them (:mod:`torchkiln.artifacts.abi`, verify's
:mod:`torchkiln.verify.linkage`): together with the distributions it declares, in one ``site-packages``.
Paths inside an installation are the RECORD's, relative to that directory (``torch/lib/libc10.so``,
``nvidia/cu13/lib/libcudart.so.13``), so distributions read from different directories (an unpacked wheel and
a build venv) still meet where pip would put them.
"""

from __future__ import annotations

import csv
import importlib.metadata
import io
import posixpath
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from .elf import elf_cached

Distribution = importlib.metadata.Distribution


def installed(paths: Sequence[str] | None = None) -> dict[str, Distribution]:
    """The installed distributions by canonical name (first on the path wins, as for imports)."""
    found: dict[str, Distribution] = {}
    for dist in importlib.metadata.distributions(path=list(paths) if paths is not None else sys.path):
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonicalize_name(name), dist)
    return found


def name_of(dist: Distribution) -> str:
    return canonicalize_name(dist.metadata["Name"] or "")


def declared_dependencies(dist: Distribution, index: Mapping[str, Distribution]) -> dict[str, Distribution]:
    """The installed distributions ``dist`` requires, transitively, with the extras each requirement names
    (``cuda-toolkit[cudart,...]`` brings ``nvidia-cuda-runtime``) and markers evaluated for this machine."""
    return _requirements(dist, index)[0]


def unsatisfied_requirements(dist: Distribution, index: Mapping[str, Distribution]) -> dict[str, str]:
    """Distribution -> the requirement on it, for each one ``dist`` requires (transitively, as
    :func:`declared_dependencies` follows them) that is installed at a version the requirement does not
    accept: ``nvidia-cudnn-cu12 9.1.0.70`` where torch requires ``nvidia-cudnn-cu12==9.10.2.21``."""
    return _requirements(dist, index)[1]


def missing_requirements(dist: Distribution, index: Mapping[str, Distribution]) -> dict[str, str]:
    """Distribution -> the requirement on it, for each one ``dist`` requires (as :func:`declared_dependencies`
    follows them) that is not installed at all."""
    return _requirements(dist, index)[2]


def _requirements(
    dist: Distribution, index: Mapping[str, Distribution]
) -> tuple[dict[str, Distribution], dict[str, str], dict[str, str]]:
    seen: set[tuple[str, frozenset[str]]] = set()
    out: dict[str, Distribution] = {}
    other: dict[str, str] = {}
    missing: dict[str, str] = {}
    todo: list[tuple[Distribution, frozenset[str]]] = [(dist, frozenset())]
    while todo:
        current, extras = todo.pop()
        for text in current.requires or ():
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            if req.marker is not None and not any(
                req.marker.evaluate({"extra": extra}) for extra in (extras or {""})
            ):
                continue
            name = canonicalize_name(req.name)
            key = (name, frozenset(req.extras))
            if name not in index:
                missing.setdefault(name, f"{req.name}{req.specifier}")
                continue
            if key in seen:
                continue
            if not _satisfies(index[name], req):
                other.setdefault(name, f"{req.name}{req.specifier}")
                continue
            seen.add(key)
            out[name] = index[name]
            todo.append((index[name], frozenset(req.extras)))
    return out, {name: req for name, req in other.items() if name not in out}, missing


def _satisfies(dist: Distribution, req: Requirement) -> bool:
    """Whether the installed ``dist`` is a version ``req`` accepts (another version is not what the wheel
    declares, whatever its name)."""
    try:
        return req.specifier.contains(Version(dist.version), prereleases=True)
    except InvalidVersion:
        return False


def is_shared_object(relative: str) -> bool:
    """Named as a shared library is: ``*.so`` or ``*.so.*``."""
    name = relative.rsplit("/", 1)[-1]
    return name.endswith(".so") or ".so." in name


def recorded_files(dist: Distribution) -> list[str]:
    """The paths ``dist``'s RECORD lists, as it spells them (relative to its site-packages). The RECORD is
    read as the CSV it is (PEP 376): ``dist.files`` makes a path object of each row first, about half a
    second for torch's 40,000, where a build reads torch's twice. A distribution without a RECORD (an
    egg-info install) falls back to ``dist.files``."""
    text = dist.read_text("RECORD")
    if text is None:
        return [str(entry) for entry in dist.files or ()]
    return [row[0] for row in csv.reader(io.StringIO(text)) if row and row[0]]


def located(dist: Distribution, relative: str) -> Path:
    """Where a RECORD path of ``dist`` is on disk (``dist.locate_file``, without a path object per row)."""
    return Path(str(dist.locate_file(""))) / relative


def shared_objects(dist: Distribution) -> list[tuple[str, Path]]:
    """(path as RECORD lists it, installed path) of every ELF shared object ``dist`` installed."""
    found = []
    for relative in recorded_files(dist):
        if is_shared_object(relative):
            path = located(dist, relative)
            if elf_cached(str(path)) is not None:
                found.append((relative, path))
    return sorted(found)


def provided_libraries(dependencies: Mapping[str, Distribution]) -> dict[str, tuple[str, str]]:
    """File name and soname -> (path, distribution) of the shared objects the dependencies install."""
    provided: dict[str, tuple[str, str]] = {}
    for name, dist in sorted(dependencies.items()):
        for _, path in shared_objects(dist):
            info = elf_cached(str(path))
            for key in (path.name, info.soname if info else None):
                if key:
                    provided.setdefault(key, (str(path), name))
    return provided


def library_layout(index: Mapping[str, Distribution]) -> dict[str, tuple[str, Path]]:
    """RECORD path -> (distribution, installed path) of every shared object the distributions install: where
    an RPATH/RUNPATH entry relative to ``$ORIGIN`` lands once pip has put them in one ``site-packages``."""
    layout: dict[str, tuple[str, Path]] = {}
    for name, dist in sorted(index.items()):
        for entry in recorded_files(dist):
            relative = posixpath.normpath(entry)
            if is_shared_object(relative) and not relative.startswith("../"):
                layout.setdefault(relative, (name, located(dist, entry)))
    return layout
