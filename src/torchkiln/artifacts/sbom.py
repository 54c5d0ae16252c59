"""Software bills of materials in CycloneDX 1.6 JSON (cyclonedx-python-lib): one per wheel, one per image.

A wheel's SBOM (``dist/<wheel name without .whl>.cdx.json``, written by the publish step) has the wheel as
its ``metadata.component`` (sha256, version, the source's repository and commit) and these components:

* **its own sources' parts**: each submodule of the project's source at its commit (the lock file's
  entries, as the manifest carries them);
* **bundled native libraries** (:mod:`.sbom_bundled`): every file in the wheel's ``<package>.libs/`` and every
  runtime library the repair step copied into torch's ``lib/``, with the build host's file it was copied
  from and that file's Debian package (:mod:`.sbom_debian`);
* **what it depends on**: every ``Requires-Dist`` of its METADATA (the NVIDIA wheels, ``cuda-toolkit``,
  triton, ...), at the pinned version where there is one;
* **what the build found** (the torch wheel: CUDA toolkit, cuDNN, NCCL, MKL, MAGMA) and **the toolchain** as
  build-time components (:mod:`.sbom_toolchain`).

An image's SBOM (:mod:`.sbom_image`; ``python -m torchkiln.artifacts.sbom image``, this module's :func:`main`,
run inside the image as its last build step) lists its Debian packages and its venv's Python distributions.

The serial number is derived from the subject (the wheel's sha256, or the image's package list) and the
timestamp is the build's, so the same build gives the same SBOM.
"""

from __future__ import annotations

import argparse
import datetime as dt
import email.parser
import sys
import uuid
import warnings
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from cyclonedx.model import ExternalReference, ExternalReferenceType, HashAlgorithm, HashType, XsUri
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentScope, ComponentType
from cyclonedx.output.json import JsonV1Dot6
from packageurl import PackageURL
from packaging.requirements import InvalidRequirement, Requirement

from torchkiln.errors import EXIT_OK, TorchkilnError, UsageError
from torchkiln.files import atomic
from torchkiln.recipe.model import Recipe

from . import wheelfile
from .manifest import Manifest, WheelRecord
from .sbom_bundled import bundled_components
from .sbom_debian import _prop, _ref
from .sbom_image import image_sbom
from .sbom_inputs import compiler_of, library_path_of, sbom_source
from .sbom_toolchain import found_components, toolchain_components

SUFFIX = ".cdx.json"
MEDIA_TYPE = "application/vnd.cyclonedx+json"


def sbom_name(wheel_name: str) -> str:
    return wheel_name.removesuffix(".whl") + SUFFIX


# --- the components of a wheel ------------------------------------------------------------------------


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


def source_components(manifest: Manifest, project: str) -> Iterator[Component]:
    """The project's submodules at their commits."""
    lock = sbom_source(manifest, project)
    for sub in lock.submodules if lock else ():
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
    lock = sbom_source(manifest, record.project)
    parsed = wheelfile.parse(wheel.name)
    name = parsed.project if parsed else record.project
    props = [_prop("project", record.project), _prop("files-sha256", record.files_sha256)]
    refs = []
    if lock is not None and lock.commit:
        props.append(_prop("commit", lock.commit))
        if lock.dirty:  # built from the commit's tree with the changes the manifest's sources list
            props.append(_prop("tree-differs-from-commit", "true"))
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
