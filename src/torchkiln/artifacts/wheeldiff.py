"""Where two builds of a wheel differ: which members, and for ELF members which sections (as diffoscope would
say it, without needing diffoscope).

``torchkiln reproduce`` compares each rebuilt wheel's sha256 with the record (:func:`compare`); when one
differs and the recorded wheel is at hand (beside the record, or ``--wheels DIR``), :func:`diff_wheels`
names what differs:

* members in one wheel only;
* members whose bytes differ: an ELF member (a shared object) by its sections (name, and whether its bytes,
  size or flags differ; sections in one only), or its headers when every section is the same; a text member
  by its first differing line; RECORD by the members whose digests it lists differently; anything else by
  size and first differing offset;
* members whose bytes are the same but whose zip entry is not: timestamp (``SOURCE_DATE_EPOCH``), mode,
  compression; and the order of the entries. A wheel whose members and entries are all the same differs in
  the zip's own bytes (comments, extra fields).

Members are compared by streaming their bytes through sha256; only an ELF member that differs is extracted
(to a temporary file: pyelftools reads it there), so a wheel of gigabytes is never held in memory.
"""

from __future__ import annotations

import hashlib
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from torchkiln.files.digests import file_sha256

from .record import RecordedWheel

ELF_MAGIC = b"\x7fELF"
SHOWN_LINE = 120  # characters of a differing text line shown


@dataclass(frozen=True)
class MemberDiff:
    """One way two wheels differ: ``member`` (a path inside the wheel, or ``<archive>``), ``kind`` one of
    only-recorded, only-rebuilt, content, entry, archive; ``detail`` what differs in it."""

    member: str
    kind: str
    detail: str


@dataclass(frozen=True)
class WheelVerdict:
    """One recorded (or rebuilt) wheel: ``status`` same, differs, missing (recorded, not rebuilt) or extra
    (rebuilt, not recorded)."""

    name: str
    status: str
    recorded_sha256: str | None
    rebuilt_sha256: str | None
    members: list[MemberDiff] = field(default_factory=list)
    note: str = ""

    @property
    def same(self) -> bool:
        return self.status == "same"


def _member_digest(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> str:
    h = hashlib.sha256()
    with archive.open(info) as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _head(archive: zipfile.ZipFile, info: zipfile.ZipInfo, size: int = 4) -> bytes:
    with archive.open(info) as handle:
        return handle.read(size)


def _sections(path: Path) -> dict[str, tuple[str, int, int]]:
    """name -> (sha256 of its bytes, size, flags) of every section of an ELF file (a NOBITS section has no
    bytes: its size says it). Duplicate names are numbered (``.text#2``)."""
    out: dict[str, tuple[str, int, int]] = {}
    with path.open("rb") as handle:
        elf = ELFFile(handle)
        for section in elf.iter_sections():
            name = section.name or f"<section {section.header['sh_type']}>"
            while name in out:
                name += "#2"
            data = b"" if section.header["sh_type"] == "SHT_NOBITS" else section.data()
            out[name] = (
                hashlib.sha256(data).hexdigest(),
                section.header["sh_size"],
                section.header["sh_flags"],
            )
    return out


def _elf_detail(recorded: Path, rebuilt: Path) -> str:
    try:
        old, new = _sections(recorded), _sections(rebuilt)
    except ELFError as exc:
        return f"ELF that pyelftools cannot read ({exc})"
    differing = []
    for name in sorted(old.keys() & new.keys(), key=list(old).index):
        (sha_a, size_a, flags_a), (sha_b, size_b, flags_b) = old[name], new[name]
        if (sha_a, size_a, flags_a) == (sha_b, size_b, flags_b):
            continue
        how = f"size {size_a} -> {size_b}" if size_a != size_b else ("flags" if sha_a == sha_b else "bytes")
        differing.append(f"{name} ({how})")
    parts = []
    if differing:
        parts.append("ELF sections differ: " + ", ".join(differing))
    only_old, only_new = [n for n in old if n not in new], [n for n in new if n not in old]
    if only_old:
        parts.append("sections only in the recorded: " + ", ".join(only_old))
    if only_new:
        parts.append("sections only in the rebuilt: " + ", ".join(only_new))
    return "; ".join(parts) or "ELF headers differ (every section is the same)"


def _text_detail(old: bytes, new: bytes) -> str | None:
    """The first differing line of two UTF-8 texts; None when either is not text."""
    try:
        a, b = old.decode("utf-8").splitlines(), new.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        return None
    for number, (x, y) in enumerate(zip(a, b, strict=False), 1):
        if x != y:
            return f"line {number}: {x[:SHOWN_LINE]!r} -> {y[:SHOWN_LINE]!r}"
    return f"{len(a)} lines -> {len(b)} lines (one is the other's start)"


def _record_detail(old: bytes, new: bytes) -> str:
    """RECORD lists each member's digest: the members whose rows differ."""

    def rows(data: bytes) -> dict[str, str]:
        out = {}
        for line in data.decode("utf-8", "replace").splitlines():
            name, _, rest = line.partition(",")
            out[name] = rest
        return out

    a, b = rows(old), rows(new)
    names = sorted(n for n in a.keys() | b.keys() if a.get(n) != b.get(n))
    return "lists other digests or sizes for: " + (", ".join(names[:8]) + (" ..." if len(names) > 8 else ""))


def _bytes_detail(old: bytes, new: bytes) -> str:
    at = next((i for i, (x, y) in enumerate(zip(old, new, strict=False)) if x != y), min(len(old), len(new)))
    return f"{len(old)} -> {len(new)} bytes, first difference at offset {at}"


def _content_detail(
    name: str, recorded: zipfile.ZipFile, rebuilt: zipfile.ZipFile, a: zipfile.ZipInfo, b: zipfile.ZipInfo
) -> str:
    if _head(recorded, a) == ELF_MAGIC and _head(rebuilt, b) == ELF_MAGIC:
        with tempfile.TemporaryDirectory(prefix="torchkiln-wheeldiff-") as scratch:
            old, new = Path(scratch) / "recorded", Path(scratch) / "rebuilt"
            for archive, info, target in ((recorded, a, old), (rebuilt, b, new)):
                with archive.open(info) as source, target.open("wb") as sink:
                    for block in iter(lambda: source.read(1 << 20), b""):  # noqa: B023
                        sink.write(block)
            return _elf_detail(old, new)
    data_a, data_b = recorded.read(a), rebuilt.read(b)
    if name.endswith(".dist-info/RECORD"):
        return _record_detail(data_a, data_b)
    return _text_detail(data_a, data_b) or _bytes_detail(data_a, data_b)


def _entry_detail(a: zipfile.ZipInfo, b: zipfile.ZipInfo) -> str | None:
    parts = []
    if a.date_time != b.date_time:
        stamp = "{:04d}-{:02d}-{:02d} {:02d}:{:02d}:{:02d}"
        parts.append(f"timestamp {stamp.format(*a.date_time)} -> {stamp.format(*b.date_time)}")
    if a.external_attr != b.external_attr:
        parts.append(f"mode {a.external_attr >> 16:o} -> {b.external_attr >> 16:o}")
    if a.compress_type != b.compress_type:
        parts.append(f"compression {a.compress_type} -> {b.compress_type}")
    return "; ".join(parts) or None


def diff_wheels(recorded: Path, rebuilt: Path) -> list[MemberDiff]:
    """Every way ``rebuilt`` differs from ``recorded`` (two wheel files), members in the recorded's order."""
    with zipfile.ZipFile(recorded) as old, zipfile.ZipFile(rebuilt) as new:
        a = {i.filename: i for i in old.infolist() if not i.is_dir()}
        b = {i.filename: i for i in new.infolist() if not i.is_dir()}
        out = [MemberDiff(n, "only-recorded", "not in the rebuilt wheel") for n in a if n not in b]
        out += [MemberDiff(n, "only-rebuilt", "not in the recorded wheel") for n in b if n not in a]
        for name in (n for n in a if n in b):
            if a[name].file_size != b[name].file_size or _member_digest(old, a[name]) != _member_digest(
                new, b[name]
            ):
                out.append(MemberDiff(name, "content", _content_detail(name, old, new, a[name], b[name])))
            else:
                entry = _entry_detail(a[name], b[name])
                if entry:
                    out.append(MemberDiff(name, "entry", entry))
        common = [n for n in a if n in b]
        if common != [n for n in b if n in a]:
            out.append(MemberDiff("<archive>", "archive", "the members are in another order"))
    if not out:
        out.append(MemberDiff("<archive>", "archive", "every member is the same: the zip's own bytes differ"))
    return out


def _find(name: str, directories: Iterable[Path]) -> Path | None:
    return next((d / name for d in directories if (d / name).is_file()), None)


def compare(
    recorded: list[RecordedWheel], rebuilt: list[Path], originals: Iterable[Path] = ()
) -> list[WheelVerdict]:
    """Each recorded wheel against the rebuilt one of its name (and each rebuilt wheel the record does not
    list); a differing one's members named when its recorded file is in one of ``originals`` (checked to
    have the recorded sha256: another file of that name says nothing about the record)."""
    built = {path.name: path for path in rebuilt}
    directories = list(originals)
    out = []
    for wheel in recorded:
        path = built.pop(wheel.name, None)
        if path is None:
            out.append(
                WheelVerdict(wheel.name, "missing", wheel.sha256, None, note="the rebuild made no such wheel")
            )
            continue
        digest = file_sha256(path)
        if digest == wheel.sha256:
            out.append(WheelVerdict(wheel.name, "same", wheel.sha256, digest))
            continue
        original = _find(wheel.name, directories)
        if original is None:
            note = "the recorded wheel is not at hand to name what differs (--wheels DIR)"
            out.append(WheelVerdict(wheel.name, "differs", wheel.sha256, digest, note=note))
        elif file_sha256(original) != wheel.sha256:
            note = f"{original} is not the recorded wheel (another sha256): members not compared"
            out.append(WheelVerdict(wheel.name, "differs", wheel.sha256, digest, note=note))
        else:
            out.append(WheelVerdict(wheel.name, "differs", wheel.sha256, digest, diff_wheels(original, path)))
    for name, path in sorted(built.items()):
        out.append(
            WheelVerdict(name, "extra", None, file_sha256(path), note="the record lists no such wheel")
        )
    return out


def report_lines(verdicts: list[WheelVerdict]) -> Iterator[str]:
    """The verdicts as lines a person reads (``torchkiln reproduce``'s output)."""
    for v in verdicts:
        if v.same:
            yield f"same      {v.name}  sha256 {v.rebuilt_sha256}"
            continue
        if v.status == "differs":
            yield f"DIFFERS   {v.name}  recorded sha256 {v.recorded_sha256}, rebuilt {v.rebuilt_sha256}"
        else:
            yield f"{v.status.upper():<9} {v.name}: {v.note}"
            continue
        if v.note:
            yield f"  {v.note}"
        for m in v.members:
            yield f"  {m.member}: {m.detail}"
