"""Debian packages as SBOM components: the one that installed a file (``dpkg -S``: a bundled library's origin
on the build host, :mod:`.sbom_bundled`) or each one an image has (:mod:`.sbom_image`), with the licences
their copyright files declare, as SPDX ids; and the ``torchkiln:`` properties and references every
component of torchkiln's SBOMs is written with."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from cyclonedx.model import Property
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.model.license import DisjunctiveLicense
from cyclonedx.spdx import fixup_id
from packageurl import PackageURL

from torchkiln.process import runner

PROPERTY = "torchkiln:"  # the namespace of torchkiln's own component properties


def _prop(name: str, value: object) -> Property:
    return Property(name=PROPERTY + name, value=str(value))


def _ref(*parts: str) -> str:
    return ":".join(parts)


# --- licences ---------------------------------------------------------------------------------------

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


# --- Debian packages --------------------------------------------------------------------------------


@dataclass(frozen=True)
class DebianPackage:
    name: str
    version: str
    architecture: str
    source: str
    licences: tuple[str, ...]


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
