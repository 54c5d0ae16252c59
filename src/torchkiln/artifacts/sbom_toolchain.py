"""The components of a wheel's SBOM that its build brought in without bundling them:

* **what the build found** (the torch wheel): the CUDA toolkit (nvcc's version), cuDNN, NCCL, MKL and MAGMA,
  from the manifest's toolchain where the build probed them, else the recipe's pin (``torchkiln:from``
  says which); MKL and MAGMA are linked statically (``torchkiln:linkage``);
* **the toolchain** as build-time components (``scope: excluded``, ``torchkiln:role``): the compilers,
  cmake, ninja, the compiler cache, git, and the build venv's packages, at the versions the build recorded.
"""

from __future__ import annotations

from collections.abc import Iterator

from cyclonedx.model.component import Component, ComponentScope, ComponentType
from packageurl import PackageURL

from torchkiln.recipe.model import Recipe

from . import wheelfile
from .manifest import Manifest
from .sbom_debian import _prop, _ref


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
