"""Recipe rules on what the build compiles and links with: the host gcc (for torch's C++ and for nvcc), MAGMA
and the BLAS (per platform). Rows of :data:`torchkiln.recipe.rules.RULES`.
"""

from __future__ import annotations

from collections.abc import Iterator

from packaging.specifiers import SpecifierSet

from .compat import cuda_release, minor, platform_data, torch_release
from .model import Recipe
from .rules_violations import Violation, _describe, rule


@rule(
    "gcc-range",
    "host gcc is new enough for torch and old enough for nvcc",
    ("build.gcc", "torch.version", "accelerator.cuda"),
)
def _gcc_range(r: Recipe) -> Iterator[Violation]:
    gcc = r.build.gcc
    if gcc is None:
        return
    release, cuda = torch_release(r), cuda_release(r)
    if release is not None and gcc < release["min_gcc"]:
        yield (
            "build.gcc",
            f"gcc {gcc} cannot build torch {minor(r.torch.version)} (C++{release['cxx_std']})",
            f">= {release['min_gcc']}",
        )
    if cuda is not None and gcc > cuda["max_gcc"]:
        yield (
            "build.gcc",
            f"gcc {gcc} is newer than CUDA {r.accelerator.cuda}'s nvcc accepts",
            f"<= {cuda['max_gcc']}",
        )


@rule(
    "magma",
    "MAGMA only with CUDA, with version and sha256, in the torch release's range",
    ("magma", "accelerator.kind", "torch.version"),
)
def _magma(r: Recipe) -> Iterator[Violation]:
    if r.magma is None:
        return
    if not r.accelerator.is_cuda:
        yield ("magma", "MAGMA is only used by CUDA builds", "remove [magma] for a CPU build")
        return
    doc = r.document.get("magma", {})
    for key in ("version", "sha256"):
        if key not in doc:
            yield (
                f"magma.{key}",
                "required when [magma] is present",
                "a MAGMA release such as 2.6.1" if key == "version" else "the tarball's sha256",
            )
    release = torch_release(r)
    if release is not None and "version" in doc and r.magma.version not in SpecifierSet(release["magma"]):
        yield (
            "magma.version",
            f"MAGMA {r.magma.version} does not build with torch {minor(r.torch.version)}",
            _describe(SpecifierSet(release["magma"])),
        )


@rule("blas", "MKL builds name the MKL version", ("blas",))
def _blas(r: Recipe) -> Iterator[Violation]:
    if r.blas.kind == "mkl" and r.blas.mkl is None:
        yield ("blas.mkl", 'required when blas.kind = "mkl"', "an MKL version such as 2024.2.0")
    if r.blas.kind != "mkl" and r.blas.mkl is not None:
        yield ("blas.mkl", 'only valid with blas.kind = "mkl"', 'remove it, or set blas.kind = "mkl"')


@rule(
    "platform-blas",
    "the BLAS exists on the platform (MKL x86_64 only, NVPL aarch64 only)",
    ("blas.kind", "build.platform"),
)
def _platform_blas(r: Recipe) -> Iterator[Violation]:
    """MKL is x86_64 only, NVPL aarch64 only (compat.toml [platform.*] blas)."""
    kinds = platform_data(r)["blas"]
    if r.blas.kind not in kinds:
        yield (
            "blas.kind",
            f"{r.blas.kind!r} has no build for {r.build.platform} (build.platform)",
            f"on {r.build.platform}: {', '.join(kinds)}",
        )
