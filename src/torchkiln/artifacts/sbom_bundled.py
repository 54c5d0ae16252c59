"""The components of the native libraries a wheel bundles, for its SBOM (:func:`.sbom.wheel_sbom`).

Every file in the wheel's ``<package>.libs/`` (torchvision's codecs, :mod:`.bundle`) and every runtime library
the repair step copied into torch's ``lib/`` (libgomp.so.1, ...: :mod:`.repair`, the sonames of
``data/compat.toml [runtime_libraries]``), by the SONAME read from its ELF dynamic section, with the file it was
copied from on the build host (found by SONAME through ``ldconfig -p``, the CUDA toolkit's lib64 and the
build's compiler, ``gcc -print-file-name``; told apart by the sha256 prefix :mod:`.bundle` puts in the copy's
name, or, for a copy under its own name, by its content: the same sha256 or the same GNU build ID, which
patchelf's RPATH edits keep) and, where ``dpkg -S`` knows that file, the Debian package, its version and the
licences its ``/usr/share/doc/<package>/copyright`` declares (:mod:`.sbom_debian`; a copyright file that is not
machine-readable, GCC's, gives the licence ``[runtime_libraries.licences]`` names, and the component says so).
"""

from __future__ import annotations

import hashlib
import io
import re
import struct
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from cyclonedx.model import HashAlgorithm, HashType
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.model.license import LicenseExpression

from torchkiln.files.digests import file_sha256
from torchkiln.host.loader import ldconfig_cache
from torchkiln.recipe import runtime_libraries

from .elf import build_id
from .repair import compiler_file
from .sbom_debian import DebianPackage, _deb_component, _prop, _ref, dpkg_package

# --- ELF ----------------------------------------------------------------------------------------------

SHT_DYNAMIC = 6
DT_SONAME = 14


def elf_soname(data: bytes) -> str | None:
    """DT_SONAME of an ELF shared object (32 or 64 bit, either byte order); None for other files."""
    if data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        return None
    wide, order = data[4] == 2, "<" if data[5] == 1 else ">"
    try:
        shoff = struct.unpack_from(order + ("Q" if wide else "I"), data, 0x28 if wide else 0x20)[0]
        shentsize, shnum = struct.unpack_from(order + "HH", data, 0x3A if wide else 0x2E)
        section = order + ("IIQQQQIIQQ" if wide else "IIIIIIIIII")
        headers = [struct.unpack_from(section, data, shoff + i * shentsize) for i in range(shnum)]
        for header in headers:
            if header[1] != SHT_DYNAMIC:
                continue
            strtab = headers[header[6]][4]
            entry = order + ("qQ" if wide else "iI")
            step = struct.calcsize(entry)
            for offset in range(header[4], header[4] + header[5], step):
                tag, value = struct.unpack_from(entry, data, offset)
                if tag == DT_SONAME:
                    end = data.index(b"\0", strtab + value)
                    return data[strtab + value : end].decode("utf-8", "replace")
                if tag == 0:
                    break
    except (struct.error, IndexError, ValueError):
        return None
    return None


# --- the build host: where a bundled library came from ------------------------------------------------

# The names bundle.py gives copies (<stem>.<8 hex of the original's sha256>.<rest>) and auditwheel's
# (<stem>-<8 hex>.<rest>, upstream's wheels).
_HASHED = re.compile(r"^(?P<stem>[^.-]+)[.-](?P<hash>[0-9a-f]{8})\.(?P<rest>so.*)$")


@dataclass(frozen=True)
class Origin:
    """Where a bundled library was copied from on the build host, and which package installed it."""

    path: str
    package: DebianPackage | None


def same_build(path: Path, content: bytes) -> bool:
    """Whether ``content`` (a copy in the wheel) is the file at ``path`` or the same link of it: the same
    sha256, or the same GNU build ID (a copy whose RPATH the repair step set keeps its build ID)."""
    if file_sha256(path) == hashlib.sha256(content).hexdigest():
        return True
    with path.open("rb") as stream:
        theirs = build_id(stream)
    return theirs is not None and theirs == build_id(io.BytesIO(content))


def find_origin(
    bundled_name: str,
    soname: str,
    library_path: Sequence[str],
    cache: dict[str, list[str]] | None = None,
    content: bytes | None = None,
) -> Origin | None:
    """The build host's file a bundled copy was made from: a file of that soname on the loader's cache or
    ``library_path`` whose sha256 starts with the hash in the copy's name; for a name without a hash, one
    that is the same build as ``content`` where it is given (:func:`same_build`), else any."""
    match = _HASHED.match(bundled_name)
    prefix = match["hash"] if match else None
    known = ldconfig_cache() if cache is None else cache
    candidates = [*(str(Path(d) / soname) for d in library_path), *known.get(soname, [])]
    for candidate in dict.fromkeys(candidates):
        path = Path(candidate)
        try:
            if not path.is_file() or (prefix and not file_sha256(path).startswith(prefix)):
                continue
            if not prefix and content is not None and not same_build(path, content):
                continue
        except OSError:
            continue
        return Origin(str(path.resolve()), dpkg_package(path))
    return None


# --- the components ---------------------------------------------------------------------------------


def _runtime_copy(filename: str, data: bytes) -> bool:
    """Whether the wheel's file ``filename`` is a runtime library the repair step copied in: a file named by
    its own SONAME, one of ``[runtime_libraries]``'s, in a package's ``lib/`` (``torch/lib/libgomp.so.1``)."""
    directory, _, name = filename.rpartition("/")
    return directory.endswith("/lib") and name in runtime_libraries.all_sonames() and elf_soname(data) == name


def _library_dirs(soname: str, library_path: Sequence[str], compiler: str | None) -> list[str]:
    """Where a bundled library may have come from: ``library_path``, and where the build's compiler finds it."""
    found = compiler_file(compiler, soname) if compiler else None
    return [*library_path, *([str(found.parent)] if found is not None else [])]


def bundled_components(
    wheel: Path, library_path: Sequence[str] = (), *, look_up: bool = True, compiler: str | None = None
) -> Iterator[Component]:
    """A component per native library in the wheel's ``*.libs/`` and per runtime library in a package's
    ``lib/`` (see the module docstring). ``compiler``: the build's C compiler, whose search finds them."""
    cache = ldconfig_cache() if look_up else {}
    with zipfile.ZipFile(wheel) as zf:
        for info in sorted(zf.infolist(), key=lambda i: i.filename):
            top, _, name = info.filename.partition("/")
            name = name.rpartition("/")[2]
            if info.is_dir() or not name or "/" not in info.filename:
                continue
            in_libs = top.endswith(".libs")
            if not in_libs and not info.filename.endswith(tuple(runtime_libraries.all_sonames())):
                continue
            data = zf.read(info)
            if not in_libs and not _runtime_copy(info.filename, data):
                continue
            soname = elf_soname(data) or name
            content = None if in_libs else data  # a copy under its own name: known by its content
            dirs = library_path if in_libs else _library_dirs(soname, library_path, compiler)
            origin = find_origin(name, soname, dirs, cache, content) if look_up else None
            ref = _ref("bundled", info.filename)
            props = [_prop("soname", soname), _prop("bundled-as", info.filename)]
            if origin is not None:
                props.append(_prop("origin", origin.path))
            if origin is not None and origin.package is not None:
                component = _deb_component(origin.package, ref)
                component.properties.update(props)
            else:
                component = Component(type=ComponentType.LIBRARY, name=soname, bom_ref=ref, properties=props)
                component.properties.add(_prop("origin-package", "unknown on this host"))
            declared = runtime_libraries.licence(soname)
            if not component.licenses and declared is not None:
                component.licenses.add(LicenseExpression(declared))
                component.properties.add(
                    _prop("licence-from", "data/compat.toml [runtime_libraries.licences]")
                )
            component.hashes.add(
                HashType(alg=HashAlgorithm.SHA_256, content=hashlib.sha256(data).hexdigest())
            )
            yield component
