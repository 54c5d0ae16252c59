"""A venv checked against its own RECORDs before the build relies on it (issue 47).

pip writes, for each distribution it installs, a RECORD: every file's path, sha256 and size. A venv with a file
of it removed (a half-finished pip, a disk clean-up: ``torch/lib/libtorch_global_deps.so`` gone) or changed
(truncated, edited) still has every distribution's metadata, so it passes for intact: the next compile fails
far from the cause, and ``--force`` fails the same way, until the venv is removed by hand. So before a build
relies on a venv it did not make in this run (a step runs with it, clones it or installs into it; the
environment store's entry is cloned), :func:`damage` looks at every file the venv's RECORDs list: there, of
its recorded size, and of its recorded sha256 unless it is the very file seen before (the same device,
inode, size and modification time: hard links of one file, in a clone or in the store, are the same file).

The answer is kept by the identities of the RECORD files themselves (:class:`~torchkiln.plan.records.Records`,
the work directory's and the environment store's: a clone of a venv, or a store entry and the venv linked to
it, read one answer), and holds each listed file's identity when it was last found sound. A check is then one
``stat`` per file and no reading (each directory opened once: :func:`_identities`): about 55 ms for the
21,000 hashed files of a torch 2.13 CPU venv on a 2-core machine. Only a file whose identity changed is
hashed. Files outside site-packages (``bin/`` scripts, whose ``#!`` line a clone rewrites for its own path,
headers, man pages) are checked for presence only.

Not seen: a write that keeps a file's inode, size and modification time (``touch -r`` after an edit), and what
no RECORD lists (bytecode, files a program wrote into the venv after its install).
"""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from torchkiln.plan.records import Records

__all__ = ["Damage", "damage"]

KIND = "venvfiles"
SHOWN = 3  # problems named in the one line; the rest counted


@dataclass(frozen=True)
class Damage:
    """What a venv's files say against their RECORDs: each problem, first found first."""

    venv: Path
    problems: tuple[str, ...]

    def line(self) -> str:
        """The one line a build says of it."""
        named = "; ".join(self.problems[:SHOWN])
        more = len(self.problems) - SHOWN
        return f"{self.venv} is damaged: {named}" + (f"; and {more} more file(s)" if more > 0 else "")


@dataclass(frozen=True)
class _Listed:
    """A file a RECORD lists: its path relative to the venv, the distribution, its digest and size."""

    path: str
    owner: str
    digest: str  # "sha256=<urlsafe base64>"; "" for a file checked for presence only
    size: int | None


def damage(venv: Path, records: Records, *, trust: bool = False) -> Damage | None:
    """None when every file the RECORDs of ``venv``'s distributions list is as they say; else what is not.
    ``trust``: a file not seen before is taken as it is (not hashed): the venv as a step just left it, whose
    files are the step's own writes. A sound venv's files are kept as seen (``records``)."""
    venv = venv.absolute()
    base = str(venv) + os.sep
    problems, recorded = _record_files(venv)
    key = Records.key(KIND, {"records": recorded})
    kept = records.get(key) if not problems else None
    previous: dict[str, str] = {}
    if kept is not None:
        files, seen, present = (_lines(kept.get(name)) for name in ("files", "ids", "present"))
        if _identities(base, files) == seen and all(os.path.exists(base + path) for path in present):
            return None
        previous = dict(zip(files, seen, strict=False))
    listed = list(_listing(venv)) if not problems else []
    hashed, ids, present = [], [], []
    for item in listed:
        if not item.digest:
            present.append(item.path)
            if not os.path.exists(base + item.path):
                problems.append(f"{item.path} ({item.owner}) is missing")
            continue
        identity, problem = _judge(base + item.path, item, previous, trust)
        if problem is not None:
            problems.append(problem)
        elif identity is not None:
            hashed.append(item.path)
            ids.append(identity)
    if problems:
        return Damage(venv, tuple(problems))
    records.put(key, {"files": "\n".join(hashed), "ids": "\n".join(ids), "present": "\n".join(present)})
    return None


def _lines(text: object) -> list[str]:
    return text.split("\n") if isinstance(text, str) and text else []


def _judge(path: str, item: _Listed, previous: dict[str, str], trust: bool) -> tuple[str | None, str | None]:
    """The file's identity when it is as its RECORD says, else the problem."""
    identity = _identity(path)
    if identity is None:
        return None, f"{item.path} ({item.owner}) is missing"
    size = int(identity.rsplit(":", 2)[1])
    if item.size is not None and size != item.size:
        return None, f"{item.path} ({item.owner}) has {size} bytes, its RECORD says {item.size}"
    if trust or previous.get(item.path) == identity or _digest(path, item.digest) == item.digest:
        return identity, None
    return None, f"{item.path} ({item.owner}) differs from its RECORD ({item.digest.partition('=')[0]})"


def _identities(base: str, paths: list[str]) -> list[str | None]:
    """:func:`_identity` of each of ``paths`` (relative to ``base``), in their order. A RECORD lists a
    directory's files together: each run of them is looked up in its directory, opened once, which takes a
    sixth off the 21,000 lookups of a torch venv (65 to 53 ms on a 2-core machine)."""
    found: list[str | None] = []
    current, fd = None, -1
    try:
        for path in paths:
            directory, _, name = path.rpartition(os.sep)
            if directory != current:
                if fd >= 0:
                    os.close(fd)
                current, fd = directory, -1
                with contextlib.suppress(OSError):  # missing: so are its files
                    fd = os.open(base + directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                st = os.stat(name, dir_fd=fd) if fd >= 0 else None
            except OSError:
                st = None
            found.append(None if st is None else _named(st))
    finally:
        if fd >= 0:
            os.close(fd)
    return found


def _identity(path: str) -> str | None:
    """A file as the kernel names it (device, inode, size, modification time): hard links of it are it."""
    try:
        return _named(os.stat(path))
    except OSError:
        return None


def _named(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def _sites(venv: Path) -> list[str]:
    """The venv's site-packages directories, relative to it (``lib64`` is a link to ``lib``)."""
    return sorted(str(p.relative_to(venv)) for p in (venv / "lib").glob("python*/site-packages"))


def _record_files(venv: Path) -> tuple[list[str], list[list[str]]]:
    """Each installed distribution's RECORD (relative path and identity), and the problems: a distribution
    without one (its files unknown: pip's own half-finished install or removal)."""
    problems: list[str] = []
    found: list[list[str]] = []
    base = str(venv) + os.sep
    for site in _sites(venv):
        try:
            names = sorted(os.listdir(base + site))
        except OSError as exc:
            problems.append(f"{site} cannot be read ({exc.strerror})")
            continue
        for name in names:
            if not name.endswith(".dist-info"):
                continue
            record = f"{site}/{name}/RECORD"
            identity = _identity(base + record)
            if identity is None:
                problems.append(
                    f"{record} is missing (what {name[: -len('.dist-info')]} installed is unknown)"
                )
            else:
                found.append([record, identity])
    return problems, found


def _listing(venv: Path) -> Iterator[_Listed]:
    """Every file the RECORDs list, as paths relative to the venv; those outside site-packages for presence."""
    for site in _sites(venv):
        for record in sorted((venv / site).glob("*.dist-info/RECORD")):
            owner = record.parent.name[: -len(".dist-info")]
            with contextlib.suppress(OSError), record.open(newline="", encoding="utf-8") as handle:
                for row in csv.reader(handle):
                    if len(row) < 2 or not row[1] or os.path.isabs(row[0]):
                        continue  # RECORD itself and bytecode carry no digest
                    path = os.path.normpath(f"{site}/{row[0]}")
                    if path.startswith(".."):
                        continue  # outside the venv
                    inside = path.startswith(site + os.sep)
                    size = int(row[2]) if len(row) > 2 and row[2].isdigit() else None
                    yield _Listed(path, owner, row[1] if inside else "", size if inside else None)


def _digest(path: str, recorded: str) -> str | None:
    """The file's digest in RECORD's form, with RECORD's algorithm (sha256, or another hashlib knows)."""
    algorithm = recorded.partition("=")[0]
    try:
        h = hashlib.new(algorithm)
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                h.update(chunk)
    except (OSError, ValueError):
        return None
    return f"{algorithm}={base64.urlsafe_b64encode(h.digest()).rstrip(b'=').decode()}"
