"""What the dynamic loader reads of an ELF file, read with pyelftools (nothing is loaded, nothing is run).

One reader for the two questions torchkiln asks of a wheel's native code: where each ``NEEDED`` entry resolves
(:mod:`torchkiln.artifacts.abi`, :mod:`torchkiln.verify.linkage`) and which symbol versions it needs of the
system's libraries (``GLIBC_2.28``, ``GLIBCXX_3.4.30``: the version needs of ``.gnu.version_r``, read with
auditwheel's own reader, :func:`auditwheel.elfutils.elf_find_versioned_symbols`, so the manylinux verdict
rests on the same reading as auditwheel's).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import json
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSegment
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import NoteSection
from elftools.elf.segments import InterpSegment

from torchkiln.errors import DocumentError
from torchkiln.files import atomic

from . import jsonfile


@dataclass(frozen=True)
class ElfDynamic:
    """What the loader reads of one ELF object: its dynamic entries, class and machine, its program
    interpreter (an executable's), and the symbol versions it needs of other objects ((library, version):
    ``("libc.so.6", "GLIBC_2.28")``; the dynamic loader's own are left out, as auditwheel leaves them)."""

    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]
    soname: str | None
    elfclass: int
    machine: str
    interpreter: str | None = None
    versions: tuple[tuple[str, str], ...] = ()
    elftype: str = ""  # e_type: ET_DYN for a shared object (or a position-independent executable), ET_EXEC

    @property
    def shared(self) -> bool:
        """Whether the loader can load it as a library (ET_DYN)."""
        return self.elftype == "ET_DYN"

    @property
    def search(self) -> tuple[str, tuple[str, ...]]:
        """The object's own search path and its tag: DT_RUNPATH when it has one (DT_RPATH is then ignored:
        glibc's ``elf/dl-load.c``), else DT_RPATH."""
        return ("RUNPATH", self.runpath) if self.runpath else ("RPATH", self.rpath)


# The dynamic tags the loader reads, and the attribute pyelftools gives each one's string under.
_TAGS = {"DT_NEEDED": "needed", "DT_RPATH": "rpath", "DT_RUNPATH": "runpath", "DT_SONAME": "soname"}


def _versions(elf: ELFFile) -> tuple[tuple[str, str], ...]:
    from auditwheel.elfutils import elf_find_versioned_symbols  # imported when a version is asked for

    return tuple(sorted(set(elf_find_versioned_symbols(elf))))


def read_elf(path: Path, *, versions: bool = False) -> ElfDynamic | None:
    """The dynamic entries of ``path`` (and, with ``versions``, its symbol version needs); None when it is not
    an ELF file (or not a readable one)."""
    try:
        with path.open("rb") as stream:
            if stream.read(4) != b"\x7fELF":
                return None
            stream.seek(0)
            elf = ELFFile(stream)
            found: dict[str, list[str]] = {attr: [] for attr in _TAGS.values()}
            interpreter = None
            for segment in elf.iter_segments():
                if isinstance(segment, InterpSegment):
                    interpreter = segment.get_interp_name()
                if isinstance(segment, DynamicSegment):
                    for tag in segment.iter_tags():
                        attr = _TAGS.get(tag.entry.d_tag)
                        if attr is not None:
                            found[attr].append(str(getattr(tag, attr)))
            return ElfDynamic(
                needed=tuple(found["needed"]),
                rpath=tuple(p for entry in found["rpath"] for p in entry.split(":") if p),
                runpath=tuple(p for entry in found["runpath"] for p in entry.split(":") if p),
                soname=found["soname"][0] if found["soname"] else None,
                elfclass=elf.elfclass,
                machine=str(elf["e_machine"]),
                interpreter=interpreter,
                versions=_versions(elf) if versions else (),
                elftype=str(elf["e_type"]),
            )
    except (ELFError, OSError, ValueError, KeyError, AssertionError):
        return None


# Where what read_elf found is kept between processes (keeping), by the file's identity: a build reads the
# same torch libraries beside the build venv (publish) and in the check's venv, hard links of one inode. A
# context variable: each build (its thread) keeps its readings in its own records, never another's.
_KEPT: contextvars.ContextVar[tuple[Path, ...]] = contextvars.ContextVar("torchkiln_elf_kept", default=())
_FORMAT = 1


@contextlib.contextmanager
def keeping(directories: Sequence[Path]) -> Iterator[None]:
    """Within the block, keep what :func:`elf_cached` reads in ``directories`` (read in order, written to all;
    empty: nothing is kept), under the file's identity: device, inode, size and modification time (ns), never
    its path, so the hard links of one library (an environment store's venvs, their clones) share one
    reading; a file replaced or rewritten has another identity. A record that cannot be read or written
    costs a reading."""
    token = _KEPT.set(tuple(Path(d) for d in directories))
    try:
        yield
    finally:
        _KEPT.reset(token)


@functools.cache
def _code() -> str:
    text = Path(__file__).read_bytes()
    return hashlib.sha256(text).hexdigest()[:16]


def _kept_name(path: str, versions: bool) -> str | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    identity = f"{_FORMAT}:{_code()}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{versions}"
    return f"elf-{hashlib.sha256(identity.encode()).hexdigest()[:40]}.json"


def _read_kept(name: str, kept: Sequence[Path]) -> ElfDynamic | None:
    for directory in kept:
        path = directory / name
        with contextlib.suppress(OSError, ValueError, DocumentError):
            return jsonfile.from_data(
                ElfDynamic, json.loads(path.read_text(encoding="utf-8")), file=str(path)
            )
    return None


def _keep(name: str, found: ElfDynamic, kept: Sequence[Path]) -> None:
    text = json.dumps(jsonfile.to_data(found), sort_keys=True)
    for directory in kept:
        with contextlib.suppress(OSError):
            atomic.keep_text(directory, name, text)


def elf_cached(path: str, versions: bool = False) -> ElfDynamic | None:
    """:func:`read_elf` of a regular file, kept (a library many objects need is read once; in the
    directories of :func:`keeping`, once per file identity). The memo in this process is keyed by the file's
    identity (ctime included: no write leaves it) and where readings are kept, so it answers what a
    fresh process would, whichever build asks."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return _elf_read(path, versions, identity, _KEPT.get())


@functools.lru_cache(maxsize=8192)
def _elf_read(
    path: str, versions: bool, identity: tuple[int, ...], kept: tuple[Path, ...]
) -> ElfDynamic | None:
    name = _kept_name(path, versions) if kept else None
    found = _read_kept(name, kept) if name else None
    if found is None:
        found = read_elf(Path(path), versions=versions)
        if found is not None and name and _kept_name(path, versions) == name:  # not replaced while read
            _keep(name, found, kept)
    return found


def forget_readings() -> None:
    """This process's memo of :func:`elf_cached` emptied (a test that reads through the kept records)."""
    _elf_read.cache_clear()


def compatible(path: Path, want: ElfDynamic) -> bool:
    """Whether ``path`` is an ELF object the loader would take for ``want``: same class and machine (it skips
    the others and searches on)."""
    found = elf_cached(str(path))
    return found is not None and (found.elfclass, found.machine) == (want.elfclass, want.machine)


def dynamic_strings(path: Path) -> bytes:
    """The ``.dynstr`` section of an ELF object (the names of the symbols it defines and imports)."""
    try:
        with path.open("rb") as stream:
            section = ELFFile(stream).get_section_by_name(".dynstr")
            return bytes(section.data()) if section is not None else b""
    except (ELFError, OSError, ValueError):
        return b""


def build_id(stream: BinaryIO) -> str | None:
    """The GNU build ID of an ELF file (``.note.gnu.build-id``, hex), which identifies the link that made it:
    patchelf's edits of the dynamic section keep it, so a copy whose RPATH was set is still known as the
    file it was copied from. None for a file without one, or not ELF."""
    try:
        for section in ELFFile(stream).iter_sections():
            if isinstance(section, NoteSection):
                for note in section.iter_notes():
                    if note["n_type"] == "NT_GNU_BUILD_ID":
                        return str(note["n_desc"])
    except (ELFError, OSError, ValueError, KeyError, AssertionError):
        return None
    return None
