"""Container images of a recipe: which base, which build args, which tags and labels.

Everything the Dockerfiles in ``docker/`` take as ``ARG`` is computed here, from the recipe, in one place:
:func:`devel_args` / :func:`runtime_args` the two mappings, over the tables of the bases in
:mod:`torchkiln.recipe.image_bases` (DISTROS, CUDA_IMAGES, PYPI_TOOLKITS, MAGMA_BUILDS: preflight reads them
too, to offer the devel image only for a recipe it builds). ``torchkiln images`` and the generated
``docker-bake.json`` (:mod:`torchkiln.images.bake`) both use them, so a plain ``docker buildx bake`` and
``torchkiln images`` build the same thing.

A CUDA recipe's toolkit comes from one of two sources (``TOOLKIT_SOURCES``): ``pypi``, NVIDIA's CUDA
wheels on a plain distribution image (any PyPI mirror will do; the default wherever ``PYPI_TOOLKITS``
has the recipe's CUDA), or ``nvidia``, NVIDIA's ``nvidia/cuda`` devel and runtime images.

The runtime image takes its wheels from a build context named ``dist``: a directory a build published
into, whose ``manifest.json`` says which wheels they are, from which commits and which recipe
(:func:`runtime_args`), or in bake the ``wheels`` stage of the devel Dockerfile.
"""

from __future__ import annotations

import base64
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from torchkiln import __version__
from torchkiln.artifacts.manifest import Manifest
from torchkiln.artifacts.provenance import statement_name
from torchkiln.artifacts.signing import PublicKey, keyid, load_envelope, verify
from torchkiln.errors import DocumentError, Problem, RecipeError, TorchkilnError, UsageError, few
from torchkiln.files.digests import file_sha256
from torchkiln.images.platforms import image_platform
from torchkiln.recipe.compat import minor
from torchkiln.recipe.image_bases import (
    MAGMA_BUILDS,
    PYPI_TOOLKITS,
    Distro,
    distro_for,
    nvidia_toolkit,
    toolkit_source,
)
from torchkiln.recipe.model import Recipe

FLAVOURS = ("devel", "wheels", "runtime")
DEFAULT_REGISTRY = "localhost"
IMAGE_NAME = "torchkiln"
CACHE_SECRET_ID = "cache_password"
# The build cluster's client token (distributed compiles): a secret of the compiling step, read where a
# BuildKit secret lands, so the recipe's [cluster] says credentials_file = CLUSTER_SECRET_FILE. The id keeps its
# name from before issue 48: recipes name its file, and docker/Dockerfile.devel mounts it.
CLUSTER_SECRET_ID = "dist_token"
CLUSTER_SECRET_FILE = f"/run/secrets/{CLUSTER_SECRET_ID}"
# pip's configuration for every pip step of an image build (a package index mirror, its credentials):
# a secret mounted at /etc/pip.conf (pip's global configuration file) for that step only.
PIP_CONFIG_SECRET_ID = "pip_config"
SOURCE_URL = "https://github.com/torchkiln/torchkiln"

# Repository paths, relative to the build context (a torchkiln checkout).
DOCKERFILES = {
    "devel": "docker/Dockerfile.devel",
    "wheels": "docker/Dockerfile.devel",
    "runtime": "docker/Dockerfile.runtime",
}


# torchvision's optional parts -> the distribution packages its setup.py looks for when building them
# (libpng-config, jpeglib.h, webp/decode.h). nvjpeg comes with the CUDA toolkit; the video decoders are
# gone from torchvision since 0.24 (rules refuse them there).
VISION_DEV_PACKAGES: dict[str, tuple[str, ...]] = {
    "png": ("libpng-dev",),
    "jpeg": ("libjpeg-dev",),
    "webp": ("libwebp-dev",),
}


def accelerator_tag(recipe: Recipe) -> str:
    """'cpu' or 'cu130': the accelerator part of image tags and wheel local labels."""
    acc = recipe.accelerator
    if not acc.is_cuda or acc.cuda is None:
        return "cpu"
    return f"cu{acc.cuda.major}{acc.cuda.minor}"


def devel_base(recipe: Recipe, cuda_from: str = "auto") -> str:
    """The devel image's base: the plain distribution image (CPU, or the toolkit from PyPI), or NVIDIA's
    devel image for the recipe's CUDA (nvcc, headers)."""
    source = toolkit_source(recipe, cuda_from)
    _, distro = distro_for(recipe, source)
    if source != "nvidia":
        return distro.image
    return f"nvidia/cuda:{nvidia_toolkit(recipe)}-devel-{distro.cuda_suffix}"


def runtime_base(recipe: Recipe, cuda_from: str = "auto") -> str:
    """The runtime image's base: the plain distribution image (the CUDA libraries then come as the wheels'
    own dependencies from the package index, as they do for upstream's PyPI torch), or NVIDIA's runtime
    image. No compiler goes in, so the recipe's gcc does not matter here."""
    source = toolkit_source(recipe, cuda_from)
    _, distro = distro_for(recipe, source, check_gcc=False)
    if source != "nvidia":
        return distro.image
    return f"nvidia/cuda:{nvidia_toolkit(recipe)}-runtime-{distro.cuda_suffix}"


def plain_distro(recipe: Recipe, target: str, cuda_from: str = "auto") -> tuple[str, Distro]:
    """The distribution (key, row) whose plain image is ``target``'s base, for making that base locally
    (``--base-from debootstrap``); UsageError when the base is NVIDIA's image, which no archive makes."""
    source = toolkit_source(recipe, cuda_from)
    if source == "nvidia":
        raise UsageError(
            "--base-from debootstrap: this build's base is NVIDIA's CUDA image (--cuda-from nvidia), which "
            "debootstrap cannot make (valid: --cuda-from pypi, where torchkiln knows the recipe's CUDA on PyPI: "
            f"{', '.join(PYPI_TOOLKITS)}; or --base-rootfs with a root that has the toolkit)"
        )
    return distro_for(recipe, source, check_gcc=target != "runtime")


def base_images(recipe: Recipe, cuda_from: str = "auto") -> tuple[str, str]:
    """(devel base, runtime base) for the toolkit source ``cuda_from``."""
    return devel_base(recipe, cuda_from), runtime_base(recipe, cuda_from)


def _s(value: object | None) -> str:
    return "" if value is None else str(value)


def devel_args(recipe: Recipe, *, base_image: str | None = None, cuda_from: str = "auto") -> dict[str, str]:
    """Build args of docker/Dockerfile.devel (stages devel, build, wheels) for a recipe."""
    acc = recipe.accelerator
    magma = recipe.magma if acc.is_cuda else None
    if magma is not None and str(magma.version) not in MAGMA_BUILDS:
        raise RecipeError(
            [
                Problem(
                    recipe.source,
                    "magma.version",
                    f"torchkiln's images do not know how to build MAGMA {magma.version}",
                    ", ".join(MAGMA_BUILDS),
                )
            ]
        )
    source = toolkit_source(recipe, cuda_from)
    if base_image is None:
        base_image = devel_base(recipe, cuda_from)
    wheels = PYPI_TOOLKITS[minor(acc.cuda)].requirements() if source == "pypi" and acc.cuda else []
    vision_packages = [pkg for f in recipe.vision.enabled for pkg in VISION_DEV_PACKAGES.get(f, ())]
    return {
        "BASE_IMAGE": base_image,
        "KILN_PYTHON": recipe.python,
        "KILN_GCC": _s(recipe.build.gcc),
        "KILN_CUDA": minor(acc.cuda) if acc.is_cuda and acc.cuda else "",
        "KILN_CUDA_FROM": source or "",
        "KILN_TOOLKIT_TARGET": image_platform(recipe).toolkit_target if acc.is_cuda else "",
        "QEMU_CPU": image_platform(recipe).qemu_cpu,
        "KILN_CUDA_WHEELS": " ".join(wheels),
        "KILN_CUDNN": _s(acc.cudnn) if acc.is_cuda else "",
        "KILN_NCCL": _s(acc.nccl) if acc.is_cuda else "",
        "KILN_CUDA_ARCH_LIST": acc.arch_list_env if acc.is_cuda else "",
        "KILN_MKL": _s(recipe.blas.mkl) if recipe.blas.kind == "mkl" else "",
        "KILN_OPENBLAS": "1" if recipe.blas.kind == "openblas" else "",
        "KILN_MAGMA_VERSION": _s(magma.version) if magma else "",
        "KILN_MAGMA_URL": _s(magma.url) if magma else "",
        "KILN_MAGMA_SHA256": magma.sha256 if magma else "",
        "KILN_VISION_PACKAGES": " ".join(vision_packages),
        "RECIPE_FILE": recipe_file(recipe),
        "CACHE_CREDENTIALS_ENV": _s(recipe.cache.credentials_env),
    }


def recipe_file(recipe: Recipe) -> str:
    """The recipe's file name inside the ``recipe`` build context (its directory)."""
    return recipe.path.name if recipe.path else f"{recipe.name}.toml"


def runtime_args(
    recipe: Recipe,
    manifest: Manifest | None = None,
    *,
    manifest_file: str = "manifest.json",
    base_image: str | None = None,
    cuda_from: str = "auto",
) -> dict[str, str]:
    """Build args of docker/Dockerfile.runtime. With the ``manifest`` of the build whose dist/ the image
    installs (:func:`torchkiln.artifacts.published.read_published`), the exact wheel versions, source commits and the
    recipe's name and sha256 are the manifest's; it must be this recipe's build. Without one, from the recipe
    (the bake file, whose runtime targets take their wheels from the ``wheels`` stage: the image's sanity
    gate then compares them with the manifest that stage exported)."""
    acc = recipe.accelerator
    if base_image is None:
        base_image = runtime_base(recipe, cuda_from)
    return {
        "BASE_IMAGE": base_image,
        "KILN_PYTHON": recipe.python,
        "KILN_CUDA": minor(acc.cuda) if acc.is_cuda and acc.cuda else "",
        "KILN_CUDNN": _s(acc.cudnn) if acc.is_cuda else "",
        "KILN_NCCL": _s(acc.nccl) if acc.is_cuda else "",
        **(
            _built_from_manifest(recipe, manifest, manifest_file)
            if manifest is not None
            else _built_from_recipe(recipe)
        ),
        "RECIPE_FILE": recipe_file(recipe),
        "TORCHKILN_VERSION": __version__,
        "QEMU_CPU": image_platform(recipe).qemu_cpu,
    }


def _built_from_recipe(recipe: Recipe) -> dict[str, str]:
    return {
        "KILN_TORCH_VERSION": recipe.torch_wheel_version,
        "KILN_TORCHVISION_VERSION": recipe.torchvision_wheel_version,
        "KILN_TORCH_COMMIT": _s(recipe.torch.commit),
        "KILN_TORCHVISION_COMMIT": _s(recipe.torchvision.commit),
        "RECIPE_NAME": recipe.name,
        "RECIPE_SHA256": recipe.sha256,
    }


def _built_from_manifest(recipe: Recipe, manifest: Manifest, file: str) -> dict[str, str]:
    """What the manifest says was built: the wheels' versions, the commits their sources were at."""
    built = manifest.recipe
    if built.sha256 != recipe.sha256:
        raise DocumentError(
            [
                Problem(
                    file,
                    "recipe",
                    f"the wheels were built from {built.name} (sha256 {built.sha256[:12]}...), not from "
                    f"{recipe.source} (sha256 {recipe.sha256[:12]}...)",
                    "the recipe the wheels were built with, or build them again with this one",
                )
            ]
        )
    torch = manifest.wheel("torch")
    if torch is None:
        listed = few([w.name for w in manifest.wheels]) or "no wheels"
        raise DocumentError(
            [Problem(file, "wheels", f"no torch wheel (it lists: {listed})", "a torch wheel")]
        )
    vision = manifest.wheel("torchvision")

    def commit(project: str) -> str:
        source = manifest.sources.get(project)
        return _s(source.commit) if source is not None else ""

    return {
        "KILN_TORCH_VERSION": torch.version,
        "KILN_TORCHVISION_VERSION": vision.version if vision else "",
        "KILN_TORCH_COMMIT": commit("torch"),
        "KILN_TORCHVISION_COMMIT": commit("torchvision") if vision else "",
        "RECIPE_NAME": built.name,
        "RECIPE_SHA256": built.sha256,
    }


def provenance_args(dist: Path, manifest: Manifest, key: PublicKey | None) -> dict[str, str]:
    """Build args of the runtime image for the signed provenance statement in ``dist`` (``torchkiln build
    --sign-key-*`` wrote it): its file name and sha256 (the image keeps the file and labels it with its
    digest) and, with ``key``, the public key (base64 DER: public, a build arg like any other), against
    which the statement is checked here first and by the image's sanity gate again. Empty without one."""
    path = dist / statement_name(manifest.recipe.name)
    args = dict.fromkeys(
        ("KILN_PROVENANCE", "KILN_PROVENANCE_SHA256", "KILN_PROVENANCE_KEY", "KILN_PROVENANCE_KEYID"), ""
    )
    if not path.is_file():
        if key is not None:
            raise UsageError(
                f"--provenance-key: {path}: no such file (valid: a dist/ that torchkiln build --sign-key-file "
                "or --sign-key-env published into)"
            )
        return args
    args["KILN_PROVENANCE"] = path.name
    args["KILN_PROVENANCE_SHA256"] = file_sha256(path)
    if key is not None:
        verdict = verify(load_envelope(path, "--dist"), key)
        if not verdict.ok:
            raise TorchkilnError(f"{path}: {verdict.message} (--provenance-key)")
        der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        args["KILN_PROVENANCE_KEY"] = base64.b64encode(der).decode("ascii")
        args["KILN_PROVENANCE_KEYID"] = keyid(key)
    return args


# ------------------------------------------------------------------------------------------------------
# Tags and labels.
# ------------------------------------------------------------------------------------------------------


def image_tag(recipe: Recipe, flavour: str, registry: str = DEFAULT_REGISTRY) -> str:
    """``<registry>/torchkiln:<torch version>-<cpu|cuXY>[-<arch>]-<flavour>``, e.g.
    ``.../torchkiln:2.14.0-cu130-devel``; images of another machine than linux/amd64 name its Debian
    architecture (``2.13.0-cu130-arm64-runtime``), so an x86_64 and an aarch64 recipe of a release never
    share a tag."""
    if flavour not in FLAVOURS:
        raise UsageError(f"unknown image flavour {flavour!r} (valid: {', '.join(FLAVOURS)})")
    registry = registry.rstrip("/")
    prefix = f"{registry}/" if registry else ""
    arch = image_platform(recipe).deb_arch
    machine = "" if arch == "amd64" else f"-{arch}"
    return f"{prefix}{IMAGE_NAME}:{recipe.torch.version}-{accelerator_tag(recipe)}{machine}-{flavour}"


def image_labels(recipe: Recipe, flavour: str) -> dict[str, str]:
    """OCI labels every image carries. The runtime image's version labels come from its Dockerfile (the
    wheel actually installed, which may be an upstream wheel of the same release), not from the recipe."""
    labels = {
        "org.opencontainers.image.title": f"torchkiln {flavour} ({recipe.name})",
        "org.opencontainers.image.version": str(recipe.torch_wheel_version),
        "io.torchkiln.recipe": recipe.name,
        "io.torchkiln.recipe-sha256": recipe.sha256,
    }
    if flavour == "runtime":
        del labels["org.opencontainers.image.version"]
    return labels
