"""Software bills of materials in CycloneDX 1.6 JSON (cyclonedx-python-lib): one per wheel, one per image.

A wheel's SBOM (``dist/<wheel name without .whl>.cdx.json``, written by the publish step) has the wheel as
its ``metadata.component`` (sha256, version, the source's repository and commit) and these components:

* **its own sources' parts**: each submodule of the project's source at its commit (the lock file's
  entries, as the manifest carries them);
* **bundled native libraries**: every file in the wheel's ``<package>.libs/`` (torchvision's codecs,
  :mod:`.bundle`) and every runtime library the repair step copied into torch's ``lib/`` (libgomp.so.1, ...:
  :mod:`.repair`, the sonames of ``data/compat.toml [runtime_libraries]``), by the SONAME read from its ELF
  dynamic section, with the file it was copied from on the build host (found by SONAME through ``ldconfig
  -p``, the CUDA toolkit's lib64 and the build's compiler, ``gcc -print-file-name``; told apart by the sha256
  prefix :mod:`.bundle` puts in the copy's name, or, for a copy under its own name, by its content: the same
  sha256 or the same GNU build ID, which patchelf's RPATH edits keep) and, where ``dpkg -S`` knows that file,
  the Debian package, its version and the licences its ``/usr/share/doc/<package>/copyright`` declares (a
  copyright file that is not machine-readable, GCC's, gives the licence ``[runtime_libraries.licences]``
  names, and the component says so);
* **what it depends on**: every ``Requires-Dist`` of its METADATA (the NVIDIA wheels, ``cuda-toolkit``,
  triton, ...), at the pinned version where there is one;
* **what the build found** (the torch wheel): the CUDA toolkit (nvcc's version), cuDNN, NCCL, MKL and MAGMA,
  from the manifest's toolchain where the build probed them, else the recipe's pin (``torchkiln:from``
  says which); MKL and MAGMA are linked statically (``torchkiln:linkage``);
* **the toolchain** as build-time components (``scope: excluded``, ``torchkiln:role``): the compilers,
  cmake, ninja, the compiler cache, git, and the build venv's packages, at the versions the build recorded.

An image's SBOM (``python -m torchkiln.artifacts.sbom image``, run inside the image as its last build step)
lists the Debian packages dpkg's status file says are installed (version, architecture, source package,
licences from their copyright files) and the Python distributions of the image's venv (version, licence
metadata).

The serial number is derived from the subject (the wheel's sha256, or the image's package list) and the
timestamp is the build's, so the same build gives the same SBOM.
"""

from __future__ import annotations

import argparse
import datetime as dt
import email.parser
import hashlib
import importlib.metadata
import io
import re
import struct
import sys
import uuid
import warnings
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from cyclonedx.model import ExternalReference, ExternalReferenceType, HashAlgorithm, HashType, Property, XsUri
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentScope, ComponentType
from cyclonedx.model.license import DisjunctiveLicense, LicenseExpression
from cyclonedx.output.json import JsonV1Dot6
from cyclonedx.spdx import fixup_id
from packageurl import PackageURL
from packaging.requirements import InvalidRequirement, Requirement

from torchkiln.errors import EXIT_OK, TorchkilnError, UsageError
from torchkiln.files import atomic
from torchkiln.files.digests import file_sha256
from torchkiln.host.loader import ldconfig_cache
from torchkiln.process import runner
from torchkiln.recipe import runtime_libraries
from torchkiln.recipe.model import Recipe

from . import wheelfile
from .elf import build_id
from .manifest import Manifest, WheelRecord
from .repair import compiler_file
from .sbom_inputs import compiler_of, library_path_of

SUFFIX = ".cdx.json"
MEDIA_TYPE = "application/vnd.cyclonedx+json"
PROPERTY = "torchkiln:"  # the namespace of torchkiln's own component properties

# Debian's copyright-format short names that are not SPDX ids as written (DEP-5 "License short name").
# Keys lower case: copyright files spell them either way ("Expat", "expat").
DEBIAN_SPDX = {
    "gpl-2+": "GPL-2.0-or-later",
    "gpl-2": "GPL-2.0-only",
    "gpl-3+": "GPL-3.0-or-later",
    "lgpl-2+": "LGPL-2.0-or-later",
    "lgpl-2.1+": "LGPL-2.1-or-later",
    "lgpl-2.1": "LGPL-2.1-only",
    "lgpl-3+": "LGPL-3.0-or-later",
    "expat": "MIT",
    "public-domain": "",
}


def sbom_name(wheel_name: str) -> str:
    return wheel_name.removesuffix(".whl") + SUFFIX


def _prop(name: str, value: object) -> Property:
    return Property(name=PROPERTY + name, value=str(value))


def _ref(*parts: str) -> str:
    return ":".join(parts)


# --- licences ---------------------------------------------------------------------------------------


def licence(name: str) -> DisjunctiveLicense | None:
    """An SPDX id where the name is one (or Debian's spelling of one), else the name as written."""
    name = name.strip()
    mapped = DEBIAN_SPDX.get(name.lower(), name)
    if not mapped:
        return None
    spdx = fixup_id(mapped)
    return DisjunctiveLicense(id=spdx) if spdx else DisjunctiveLicense(name=name)


def debian_licences(copyright_text: str) -> list[str]:
    """The licence short names a DEP-5 copyright file declares (each ``License:`` field's first line,
    ``or``/``and`` alternatives split), in order, once each. A file that is not DEP-5 gives none."""
    names: list[str] = []
    for line in copyright_text.splitlines():
        if not line.startswith("License:"):
            continue
        for name in re.split(r"\s+(?:or|and)\s+|\s*[|,]\s*", line.removeprefix("License:").strip()):
            name = name.strip().rstrip(",")
            if name and name not in names and " " not in name:
                names.append(name)
    return names


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
class DebianPackage:
    name: str
    version: str
    architecture: str
    source: str
    licences: tuple[str, ...]


@dataclass(frozen=True)
class Origin:
    """Where a bundled library was copied from on the build host, and which package installed it."""

    path: str
    package: DebianPackage | None


def _usr_variants(path: Path) -> list[str]:
    """The path as dpkg may have recorded it on a merged-/usr system (/lib <-> /usr/lib)."""
    text = str(path)
    other = text.removeprefix("/usr") if text.startswith("/usr/") else "/usr" + text
    return [text, other]


def dpkg_package(path: Path, root: Path = Path("/")) -> DebianPackage | None:
    """The Debian package that installed ``path`` (``dpkg -S``), with its version and licences."""
    for candidate in (*_usr_variants(path), *_usr_variants(path.resolve())):
        try:
            done = runner.run(["dpkg", "-S", "--", candidate], timeout=30)
        except runner.ProcessError:
            return None  # no dpkg here
        if done.ok and ":" in done.stdout:
            owner = done.stdout.splitlines()[0].rsplit(": ", 1)[0].split(",")[0].strip()
            return _query(owner, root)
    return None


def _query(package: str, root: Path) -> DebianPackage | None:
    fields = "${Package}\t${Version}\t${Architecture}\t${source:Package}\n"
    try:
        done = runner.run(["dpkg-query", "-W", "-f", fields, "--", package], timeout=30)
    except runner.ProcessError:
        return None
    parts = done.stdout.splitlines()[0].split("\t") if done.ok and done.stdout.strip() else []
    if len(parts) != 4:
        return None
    name, version, arch, source = parts
    return DebianPackage(name, version, arch, source, tuple(_copyright(root, name)))


def _copyright(root: Path, package: str) -> list[str]:
    try:
        text = (root / "usr/share/doc" / package / "copyright").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return debian_licences(text)


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


# --- the components of a wheel ------------------------------------------------------------------------


def _deb_component(pkg: DebianPackage, ref: str) -> Component:
    purl = PackageURL("deb", "debian", pkg.name, pkg.version, {"arch": pkg.architecture})
    return Component(
        type=ComponentType.LIBRARY,
        name=pkg.name,
        version=pkg.version,
        bom_ref=ref,
        purl=purl,
        licenses=[lic for lic in (licence(n) for n in pkg.licences) if lic],
        properties=[_prop("debian:source", pkg.source)],
    )


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


def wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        return email.parser.Parser().parsestr(zf.read(name).decode("utf-8", "replace"))


def requirement_components(requires: Iterable[str], owner: str) -> Iterator[Component]:
    """A component per ``Requires-Dist`` (the pinned version where ``==`` pins one); a project listed twice
    (under different markers) once, with every line that names it."""
    parsed: dict[str, list[tuple[str, Requirement]]] = {}
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        parsed.setdefault(wheelfile.project_key(req.name), []).append((text, req))
    for key, lines in parsed.items():
        pins = {
            s.version
            for _, r in lines
            for s in r.specifier
            if s.operator in ("==", "===") and "*" not in s.version
        }
        version = pins.pop() if len(pins) == 1 else None
        optional = all(r.marker is not None and "extra" in str(r.marker) for _, r in lines)
        yield Component(
            type=ComponentType.LIBRARY,
            name=lines[0][1].name,
            version=version,
            bom_ref=_ref("requires", owner, key),
            purl=PackageURL("pypi", name=key, version=version),
            scope=ComponentScope.OPTIONAL if optional else ComponentScope.REQUIRED,
            properties=[_prop("requirement", text) for text, _ in lines],
        )


def _found_versions(manifest: Manifest, recipe: Recipe | None) -> list[tuple[str, str | None, str, str]]:
    """(name, version, from, linkage) of the accelerator and maths libraries torch's build used."""
    chain = manifest.toolchain
    nvcc = chain.tools.get("nvcc")
    acc = recipe.accelerator if recipe else None
    mkl = recipe.blas.mkl if recipe and recipe.blas.kind == "mkl" else None
    magma = recipe.magma if recipe else None
    rows = [
        ("cuda-toolkit", nvcc.version if nvcc else None, acc.cuda if acc else None, "dynamic"),
        ("cudnn", chain.cudnn, acc.cudnn if acc else None, "dynamic"),
        ("nccl", None, acc.nccl if acc else None, "dynamic"),
        ("mkl", chain.mkl, mkl, "static"),
        ("magma", None, magma.version if magma else None, "static"),
    ]
    out: list[tuple[str, str | None, str, str]] = []
    for name, found, pinned, linkage in rows:
        if found:
            out.append((name, found, "toolchain", linkage))
        elif pinned:
            out.append((name, str(pinned), "recipe", linkage))
    return out


def found_components(manifest: Manifest, recipe: Recipe | None) -> Iterator[Component]:
    for name, version, source, linkage in _found_versions(manifest, recipe):
        yield Component(
            type=ComponentType.LIBRARY,
            name=name,
            version=version,
            bom_ref=_ref("found", name),
            scope=ComponentScope.REQUIRED,
            properties=[_prop("from", source), _prop("linkage", linkage)],
        )


def toolchain_components(manifest: Manifest) -> Iterator[Component]:
    """The build's tools and build-venv packages as build-time components (scope excluded)."""
    chain = manifest.toolchain
    if chain.python:
        yield _tool("python", chain.python, "build-interpreter")
    for name, tool in sorted(chain.tools.items()):
        comp = _tool(name, tool.version, "build-tool")
        comp.properties.add(_prop("path", tool.path))
        yield comp
    for name, version in sorted(chain.build_packages.items()):
        comp = _tool(name, version, "build-package")
        comp.purl = PackageURL("pypi", name=wheelfile.project_key(name), version=version)
        yield comp


def _tool(name: str, version: str | None, role: str) -> Component:
    return Component(
        type=ComponentType.APPLICATION,
        name=name,
        version=version,
        bom_ref=_ref("build", role, name),
        scope=ComponentScope.EXCLUDED,
        properties=[_prop("role", role)],
    )


def source_components(manifest: Manifest, project: str) -> Iterator[Component]:
    """The project's submodules at their commits."""
    lock = manifest.sources.get(project)
    for sub in lock.submodules if lock else []:
        refs = [ExternalReference(type=ExternalReferenceType.VCS, url=XsUri(sub.url))] if sub.url else []
        yield Component(
            type=ComponentType.LIBRARY,
            name=sub.path,
            version=sub.commit,
            bom_ref=_ref("source", project, sub.path),
            external_references=refs,
            properties=[_prop("commit", sub.commit), _prop("submodule-state", sub.state)],
        )


def _wheel_component(wheel: Path, record: WheelRecord, manifest: Manifest) -> Component:
    lock = manifest.sources.get(record.project)
    parsed = wheelfile.parse(wheel.name)
    name = parsed.project if parsed else record.project
    props = [_prop("project", record.project), _prop("files-sha256", record.files_sha256)]
    refs = []
    if lock is not None and lock.commit:
        props.append(_prop("commit", lock.commit))
    elif lock is not None and lock.tree_sha256:
        props.append(_prop("tree-sha256", lock.tree_sha256))
    if lock is not None and lock.repo:
        refs.append(
            ExternalReference(
                type=ExternalReferenceType.VCS,
                url=XsUri(lock.repo),
                comment=f"ref {lock.ref}, commit {lock.commit}",
            )
        )
    return Component(
        type=ComponentType.LIBRARY,
        name=name,
        version=record.version,
        bom_ref=_ref("wheel", wheel.name),
        purl=PackageURL("pypi", name=name, version=record.version),
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=record.sha256)],
        external_references=refs,
        properties=props,
    )


def _timestamp(text: str) -> dt.datetime:
    try:
        # Python 3.10's fromisoformat does not read RFC 3339's "Z" (3.11's does)
        return dt.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        return dt.datetime.now(dt.timezone.utc)


def wheel_sbom(
    wheel: Path,
    record: WheelRecord,
    manifest: Manifest,
    recipe: Recipe | None = None,
    *,
    library_path: Sequence[str] = (),
    look_up: bool = True,
    compiler: str | None = None,
) -> Bom:
    """The SBOM of one published wheel (the module docstring says what it holds). ``look_up``: find the
    bundled libraries' origins on this host (the build host; off where it is not); ``compiler``: the build's C
    compiler (:func:`compiler_of`), whose search found the runtime libraries the repair step copied."""
    root = _wheel_component(wheel, record, manifest)
    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"torchkiln:wheel:{record.sha256}"))
    bom.metadata.timestamp = _timestamp(manifest.finished)
    bom.metadata.component = root
    bom.metadata.properties.add(_prop("recipe", manifest.recipe.name))
    bom.metadata.properties.add(_prop("recipe-sha256", manifest.recipe.sha256))
    runtime = [
        *source_components(manifest, record.project),
        *bundled_components(wheel, library_path, look_up=look_up, compiler=compiler),
        *requirement_components(wheel_metadata(wheel).get_all("Requires-Dist") or [], record.project),
        *(found_components(manifest, recipe) if record.project == "torch" else []),
    ]
    for component in [*runtime, *toolchain_components(manifest)]:
        bom.components.add(component)
    bom.register_dependency(root, runtime)
    return bom


def to_json(bom: Bom) -> str:
    with warnings.catch_warnings():
        # A wheel without dependencies (a stand-in, a pure wheel) has a complete graph: its root depends on
        # nothing. cyclonedx-python-lib warns that the graph is "incomplete" then; nothing is missing.
        warnings.filterwarnings(
            "ignore", message="The Component this BOM is describing", category=UserWarning
        )
        return JsonV1Dot6(bom).output_as_string(indent=2) + "\n"


def write_sbom(path: Path, bom: Bom) -> Path:
    atomic.write_text(path, to_json(bom))
    return path


def write_wheel_sboms(dist: Path, manifest: Manifest, recipe: Recipe | None = None) -> list[Path]:
    """An SBOM beside every wheel the manifest lists in ``dist`` (atomically); their paths."""
    written = []
    library_path = library_path_of(manifest)
    compiler = compiler_of(manifest)
    for record in manifest.wheels:
        wheel = dist / record.name
        bom = wheel_sbom(wheel, record, manifest, recipe, library_path=library_path, compiler=compiler)
        written.append(write_sbom(dist / sbom_name(record.name), bom))
    return written


# --- the image ----------------------------------------------------------------------------------------


def dpkg_status(text: str) -> Iterator[dict[str, str]]:
    """The installed packages of a dpkg status file (paragraphs whose Status ends "installed")."""
    for paragraph in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in paragraph.splitlines():
            if line[:1] in (" ", "\t") or ":" not in line:
                continue
            key, _, value = line.partition(":")
            fields[key] = value.strip()
        if fields.get("Package") and fields.get("Status", "").endswith(" installed"):
            yield fields


def debian_components(root: Path) -> Iterator[Component]:
    status = root / "var/lib/dpkg/status"
    try:
        text = status.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return
    for fields in sorted(dpkg_status(text), key=lambda f: f["Package"]):
        source = fields.get("Source", fields["Package"]).split(" ")[0]
        pkg = DebianPackage(
            fields["Package"],
            fields.get("Version", ""),
            fields.get("Architecture", ""),
            source,
            tuple(_copyright(root, fields["Package"])),
        )
        yield _deb_component(pkg, _ref("deb", pkg.name, pkg.architecture))


def python_components(site_packages: Sequence[Path]) -> Iterator[Component]:
    """The distributions installed in ``site_packages`` (the image's venv)."""
    seen = set()
    dists = importlib.metadata.distributions(path=[str(p) for p in site_packages])
    for dist in sorted(dists, key=lambda d: wheelfile.project_key(d.metadata["Name"] or "")):
        name = wheelfile.project_key(dist.metadata["Name"] or "")
        if not name or name in seen:
            continue
        seen.add(name)
        meta = dist.metadata
        declared = next((v for k in ("License-Expression", "License") for v in meta.get_all(k) or []), "")
        short = declared.strip() if declared and "\n" not in declared.strip() and len(declared) < 80 else ""
        lic = licence(short) if short else None
        yield Component(
            type=ComponentType.LIBRARY,
            name=name,
            version=dist.version,
            bom_ref=_ref("pypi", name),
            purl=PackageURL("pypi", name=name, version=dist.version),
            licenses=[lic] if lic else [],
        )


def image_sbom(root: Path, site_packages: Sequence[Path], name: str, version: str = "") -> Bom:
    """The SBOM of the image whose file system is ``root``: its Debian and Python packages."""
    debs = list(debian_components(root))
    pythons = list(python_components(site_packages))
    listing = "\n".join(f"{c.bom_ref.value}@{c.version}" for c in [*debs, *pythons])
    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, "torchkiln:image:" + listing))
    image = Component(type=ComponentType.CONTAINER, name=name, version=version or None, bom_ref="image")
    bom.metadata.component = image
    for component in [*debs, *pythons]:
        bom.components.add(component)
    bom.register_dependency(image, [*debs, *pythons])
    return bom


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torchkiln.artifacts.sbom", description="the SBOM of an image's file system"
    )
    sub = parser.add_subparsers(dest="what", required=True)
    image = sub.add_parser("image", help="Debian packages (dpkg status) and a venv's Python packages")
    image.add_argument("--root", type=Path, default=Path("/"), help="the image's file system (default /)")
    image.add_argument("--site-packages", type=Path, action="append", default=[], metavar="DIR")
    image.add_argument("--name", required=True, help="the image's name in the SBOM")
    image.add_argument("--version", default="", help="its version (the torch wheel's)")
    image.add_argument("--out", type=Path, required=True, help="the file to write (atomically)")
    args = parser.parse_args(argv)
    try:
        if not (args.root / "var/lib/dpkg/status").is_file() and not args.site_packages:
            raise UsageError(
                f"--root {args.root}: no var/lib/dpkg/status and no --site-packages: nothing to list"
            )
        bom = image_sbom(args.root, args.site_packages, args.name, args.version)
        write_sbom(args.out, bom)
        print(f"{args.out}: {len(bom.components)} components")
    except (TorchkilnError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", 1)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
