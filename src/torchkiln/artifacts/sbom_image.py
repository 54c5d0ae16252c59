"""An image's SBOM (``python -m torchkiln.artifacts.sbom image``, run inside the image as its last build step):
the Debian packages dpkg's status file says are installed (version, architecture, source package, licences
from their copyright files) and the Python distributions of the image's venv (version, licence metadata)."""

from __future__ import annotations

import importlib.metadata
import re
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from packageurl import PackageURL

from . import wheelfile
from .sbom_debian import DebianPackage, _copyright, _deb_component, _ref, licence


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
