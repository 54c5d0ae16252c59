"""Container images of a recipe: which base, which build args, which tags, and the bake file.

Everything the Dockerfiles in ``docker/`` take as ``ARG`` is computed here, from the recipe, in one place:
:data:`CUDA_IMAGES` and :data:`DISTROS` are the tables, :func:`devel_args` / :func:`runtime_args` the two
mappings. ``torchkiln images`` and the generated ``docker-bake.hcl`` both use them, so a plain
``docker buildx bake`` and ``torchkiln images`` build the same thing.

The runtime image takes its wheels from a build context named ``dist`` (a directory, or in bake the
``wheels`` stage of the devel Dockerfile); :func:`find_wheels` picks the wheels of a recipe out of a
``dist/`` directory and reads the source commit each one was built from.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from . import __version__
from .errors import Problem, RecipeError, UsageError
from .recipe import Recipe

FLAVOURS = ("devel", "wheels", "runtime")
DEFAULT_REGISTRY = "localhost"
IMAGE_NAME = "torchkiln"
CACHE_SECRET_ID = "cache_password"
SOURCE_URL = "https://github.com/torchkiln/torchkiln"

# Repository paths, relative to the build context (a torchkiln checkout).
DOCKERFILES = {
    "devel": "docker/Dockerfile.devel",
    "wheels": "docker/Dockerfile.devel",
    "runtime": "docker/Dockerfile.runtime",
}


@dataclass(frozen=True)
class Distro:
    """A base distribution: its Python (what ``python3.X`` apt installs) and the gcc majors it packages."""

    python: str
    gcc: tuple[int, ...]
    cpu_image: str  # base for CPU recipes (devel and runtime alike)
    cuda_suffix: str | None  # the nvidia/cuda tag suffix built on it, if NVIDIA publishes one


# Keyed by the distribution; the Python each one ships is what decides which a recipe gets.
DISTROS: dict[str, Distro] = {
    "ubuntu22.04": Distro("3.10", (10, 11, 12), "ubuntu:22.04", "ubuntu22.04"),
    "debian12": Distro("3.11", (12,), "debian:bookworm-slim", None),
    "ubuntu24.04": Distro("3.12", (12, 13, 14), "ubuntu:24.04", "ubuntu24.04"),
    "debian13": Distro("3.13", (14,), "debian:trixie-slim", None),
}

# CUDA minor -> the toolkit release of NVIDIA's images (the same toolkit upstream installs:
# .ci/docker/common/install_cuda.sh install_126 ... install_132). 13.4 has no runfile/image yet.
CUDA_IMAGES: dict[str, str] = {
    "12.6": "12.6.3",
    "12.8": "12.8.1",
    "12.9": "12.9.1",
    "13.0": "13.0.2",
    "13.2": "13.2.1",
}


def _minor(version: Version) -> str:
    return f"{version.major}.{version.minor}"


def accelerator_tag(recipe: Recipe) -> str:
    """'cpu' or 'cu130': the accelerator part of image tags and wheel local labels."""
    acc = recipe.accelerator
    if not acc.is_cuda or acc.cuda is None:
        return "cpu"
    return f"cu{acc.cuda.major}{acc.cuda.minor}"


def distro_for(recipe: Recipe) -> tuple[str, Distro]:
    """The distribution whose own Python is the recipe's (and, for CUDA, that NVIDIA builds images on)."""
    candidates = [
        (key, d)
        for key, d in DISTROS.items()
        if d.python == recipe.python and (not recipe.accelerator.is_cuda or d.cuda_suffix is not None)
    ]
    if not candidates:
        valid = sorted(
            {
                d.python
                for d in DISTROS.values()
                if not recipe.accelerator.is_cuda or d.cuda_suffix is not None
            }
        )
        kind = "CUDA" if recipe.accelerator.is_cuda else "CPU"
        raise RecipeError(
            [
                Problem(
                    recipe.source,
                    "python.version",
                    f"no {kind} base image ships Python {recipe.python}",
                    f"{', '.join(valid)}, or pass --base-image with a python{recipe.python}",
                )
            ]
        )
    key, distro = candidates[0]
    gcc = recipe.build.gcc
    if gcc is not None and gcc not in distro.gcc:
        raise RecipeError(
            [
                Problem(
                    recipe.source,
                    "build.gcc",
                    f"gcc {gcc} is not packaged by {key} (the base for Python {recipe.python})",
                    ", ".join(map(str, distro.gcc)),
                )
            ]
        )
    return key, distro


def base_images(recipe: Recipe) -> tuple[str, str]:
    """(devel base, runtime base). CUDA: NVIDIA's devel image (nvcc, headers) and its runtime image
    (libraries only); CPU: the plain distribution image for both."""
    _, distro = distro_for(recipe)
    if not recipe.accelerator.is_cuda:
        return distro.cpu_image, distro.cpu_image
    cuda = _minor(recipe.accelerator.cuda) if recipe.accelerator.cuda else ""
    toolkit = CUDA_IMAGES.get(cuda)
    if toolkit is None:
        raise RecipeError(
            [
                Problem(
                    recipe.source,
                    "accelerator.cuda",
                    f"no NVIDIA CUDA image known for CUDA {cuda}",
                    f"{', '.join(CUDA_IMAGES)}, or pass --base-image/--runtime-base-image",
                )
            ]
        )
    return (
        f"nvidia/cuda:{toolkit}-devel-{distro.cuda_suffix}",
        f"nvidia/cuda:{toolkit}-runtime-{distro.cuda_suffix}",
    )


def _s(value: object | None) -> str:
    return "" if value is None else str(value)


def devel_args(recipe: Recipe, *, base_image: str | None = None) -> dict[str, str]:
    """Build args of docker/Dockerfile.devel (stages devel, build, wheels) for a recipe."""
    acc = recipe.accelerator
    magma = recipe.magma if acc.is_cuda else None
    if base_image is None:
        base_image = base_images(recipe)[0]
    return {
        "BASE_IMAGE": base_image,
        "KILN_PYTHON": recipe.python,
        "KILN_GCC": _s(recipe.build.gcc),
        "KILN_CUDA": _minor(acc.cuda) if acc.is_cuda and acc.cuda else "",
        "KILN_CUDNN": _s(acc.cudnn) if acc.is_cuda else "",
        "KILN_NCCL": _s(acc.nccl) if acc.is_cuda else "",
        "KILN_CUDA_ARCH_LIST": acc.arch_list_env if acc.is_cuda else "",
        "KILN_MKL": _s(recipe.blas.mkl) if recipe.blas.kind == "mkl" else "",
        "KILN_OPENBLAS": "1" if recipe.blas.kind == "openblas" else "",
        "KILN_MAGMA_VERSION": _s(magma.version) if magma else "",
        "KILN_MAGMA_URL": _s(magma.url) if magma else "",
        "KILN_MAGMA_SHA256": magma.sha256 if magma else "",
        "RECIPE_FILE": recipe_file(recipe),
        "CACHE_CREDENTIALS_ENV": _s(recipe.cache.credentials_env),
    }


def recipe_file(recipe: Recipe) -> str:
    """The recipe's file name inside the ``recipe`` build context (its directory)."""
    return recipe.path.name if recipe.path else f"{recipe.name}.toml"


def _labels_args(recipe: Recipe) -> dict[str, str]:
    return {
        "RECIPE_NAME": recipe.name,
        "RECIPE_SHA256": recipe.sha256,
        "TORCHKILN_VERSION": __version__,
    }


def runtime_args(
    recipe: Recipe, wheels: Wheels | None = None, *, base_image: str | None = None
) -> dict[str, str]:
    """Build args of docker/Dockerfile.runtime. With ``wheels`` (found in a dist/ directory) the exact
    versions and commits come from the wheels; without, from the recipe (the bake path, where the wheels
    come from the devel file's ``wheels`` stage)."""
    acc = recipe.accelerator
    if base_image is None:
        base_image = base_images(recipe)[1]
    if wheels is not None:
        torch_version, torch_commit = wheels.torch.version, wheels.torch.commit
        vision = wheels.torchvision
        vision_version = vision.version if vision else ""
        vision_commit = vision.commit if vision else ""
    else:
        torch_version, torch_commit = recipe.torch_wheel_version, _s(recipe.torch.commit)
        vision_version, vision_commit = recipe.torchvision_wheel_version, _s(recipe.torchvision.commit)
    return {
        "BASE_IMAGE": base_image,
        "KILN_PYTHON": recipe.python,
        "KILN_CUDA": _minor(acc.cuda) if acc.is_cuda and acc.cuda else "",
        "KILN_CUDNN": _s(acc.cudnn) if acc.is_cuda else "",
        "KILN_NCCL": _s(acc.nccl) if acc.is_cuda else "",
        "KILN_TORCH_VERSION": torch_version,
        "KILN_TORCHVISION_VERSION": vision_version,
        "KILN_TORCH_COMMIT": torch_commit,
        "KILN_TORCHVISION_COMMIT": vision_commit,
        "RECIPE_FILE": recipe_file(recipe),
        **_labels_args(recipe),
    }


# ------------------------------------------------------------------------------------------------------
# Tags and bake.
# ------------------------------------------------------------------------------------------------------


def image_tag(recipe: Recipe, flavour: str, registry: str = DEFAULT_REGISTRY) -> str:
    """``<registry>/torchkiln:<torch version>-<cpu|cuXY>-<flavour>``, e.g. ``.../torchkiln:2.14.0-cu130-devel``."""
    if flavour not in FLAVOURS:
        raise UsageError(f"unknown image flavour {flavour!r} (valid: {', '.join(FLAVOURS)})")
    registry = registry.rstrip("/")
    prefix = f"{registry}/" if registry else ""
    return f"{prefix}{IMAGE_NAME}:{recipe.torch.version}-{accelerator_tag(recipe)}-{flavour}"


def bake_target_name(recipe: Recipe, flavour: str) -> str:
    """Bake target names allow letters, digits, '-' and '_': the recipe name with dots made '_'."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", recipe.name) + f"-{flavour}"


def _hcl_string(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("${", "$${").replace("%{", "%%{")
    return f'"{escaped}"'


def _hcl_map(values: Mapping[str, str], indent: str) -> str:
    """An HCL object; keys quoted, since label names have dots (a bare a.b.c would be an expression)."""
    keys = {k: _hcl_string(k) for k in values}
    width = max(len(q) for q in keys.values())
    lines = [f"{indent}  {keys[k].ljust(width)} = {_hcl_string(v)}" for k, v in values.items()]
    return "{\n" + "\n".join(lines) + f"\n{indent}}}"


def _tag_expr(tag: str) -> str:
    """A tag in HCL with its registry part replaced by the REGISTRY variable."""
    return '"${REGISTRY}/' + tag.split("/", 1)[1].replace('"', '\\"') + '"'


def bake_file(recipes: Iterable[Recipe], *, recipes_root: str = "recipes") -> str:
    """docker-bake.hcl text: a devel, a wheels and a runtime target per recipe, groups per flavour.

    Tags must be unique: two recipes that would share one (same torch version and accelerator) are an
    error naming both files.
    """
    recipes = sorted(recipes, key=lambda r: r.name)
    seen: dict[str, Recipe] = {}
    for recipe in recipes:
        tag = image_tag(recipe, "devel")
        if tag in seen:
            other = seen[tag]
            raise RecipeError(
                [
                    Problem(
                        recipe.source,
                        "recipe.name",
                        f"image tag {tag.split(':', 1)[1]} is also {other.source}'s",
                        "one recipe per torch version and accelerator in a bake file",
                    )
                ]
            )
        seen[tag] = recipe
    out = [
        "# Generated by `torchkiln images --bake` from recipes/*.toml: do not edit by hand.",
        "# `docker buildx bake` builds every image; `docker buildx bake devel` (or runtime, wheels, or one",
        "# target) a part. REGISTRY=ghcr.io/you docker buildx bake --push  publishes them.",
        "",
        'variable "REGISTRY" {',
        f"  default = {_hcl_string(DEFAULT_REGISTRY)}",
        "}",
        "",
    ]
    groups: dict[str, list[str]] = {f: [] for f in FLAVOURS}
    for recipe in recipes:
        for flavour in FLAVOURS:
            groups[flavour].append(bake_target_name(recipe, flavour))
    out.append('group "default" {')
    out.append(
        "  targets = [" + ", ".join(_hcl_string(t) for f in ("devel", "runtime") for t in groups[f]) + "]"
    )
    out.append("}")
    out.append("")
    for flavour in FLAVOURS:
        out.append(f'group "{flavour}" {{')
        out.append("  targets = [" + ", ".join(_hcl_string(t) for t in groups[flavour]) + "]")
        out.append("}")
        out.append("")
    for recipe in recipes:
        for flavour in FLAVOURS:
            name = bake_target_name(recipe, flavour)
            if flavour == "runtime":
                args = runtime_args(recipe)
                contexts = {"dist": f"target:{bake_target_name(recipe, 'wheels')}", "recipe": recipes_root}
                target = "runtime"
            else:
                args = devel_args(recipe)
                contexts = {"recipe": recipes_root}
                target = flavour
            out.append(f'target "{name}" {{')
            out.append(f"  dockerfile = {_hcl_string(DOCKERFILES[flavour])}")
            out.append('  context    = "."')
            out.append(f"  target     = {_hcl_string(target)}")
            out.append(f"  contexts   = {_hcl_map(contexts, '  ')}")
            out.append(f"  args       = {_hcl_map(args, '  ')}")
            if flavour == "wheels":
                out.append(f'  secret     = ["id={CACHE_SECRET_ID},env=TORCHKILN_CACHE_PASSWORD"]')
                out.append('  output     = ["type=local,dest=dist"]')
            else:
                out.append(f"  tags       = [{_tag_expr(image_tag(recipe, flavour))}]")
            out.append(f"  labels     = {_hcl_map(image_labels(recipe, flavour), '  ')}")
            out.append("}")
            out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


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


# ------------------------------------------------------------------------------------------------------
# Wheels in a dist/ directory.
# ------------------------------------------------------------------------------------------------------

_GIT_VERSION_RE = re.compile(r"""^git_version\s*=\s*['"]([0-9a-f]{7,40}|Unknown)['"]""", re.M)


@dataclass(frozen=True)
class Wheel:
    path: Path
    project: str
    version: str
    commit: str  # the git_version recorded in <project>/version.py, "" when unknown


@dataclass(frozen=True)
class Wheels:
    torch: Wheel
    torchvision: Wheel | None


def wheel_commit(path: Path, project: str) -> str:
    """The source commit a torch/torchvision wheel records in ``<project>/version.py`` (``git_version``)."""
    try:
        with zipfile.ZipFile(path) as zf:
            text = zf.read(f"{project}/version.py").decode("utf-8", "replace")
    except (KeyError, OSError, zipfile.BadZipFile):
        return ""
    match = _GIT_VERSION_RE.search(text)
    return match.group(1) if match and match.group(1) != "Unknown" else ""


def _candidates(dist: Path, project: str, release: Version, python: str) -> list[tuple[Path, Version]]:
    cp = "cp" + python.replace(".", "")
    found = []
    for path in sorted(dist.glob("*.whl")):
        try:
            name, version, _, tags = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        if name != project or Version(version.public) != release:
            continue
        if any(t.interpreter == cp for t in tags):
            found.append((path, version))
    return found


def _pick(dist: Path, project: str, release: Version, python: str, wanted: str) -> Wheel | None:
    found = _candidates(dist, project, release, python)
    exact = [(p, v) for p, v in found if str(v) == wanted]
    chosen = exact or found
    if len(chosen) > 1:
        names = ", ".join(p.name for p, _ in chosen)
        raise UsageError(
            f"{dist}: several {project} {release} wheels for Python {python} ({names}); "
            "keep one (valid: exactly one per project)"
        )
    if not chosen:
        return None
    path, version = chosen[0]
    return Wheel(path, project, str(version), wheel_commit(path, project))


def find_wheels(dist: Path, recipe: Recipe) -> Wheels:
    """The recipe's torch wheel (required) and torchvision wheel (optional) in ``dist``.

    A wheel matches on project, release version (the recipe's ``torch.version``) and Python tag; a local
    label other than the recipe's is accepted (an upstream wheel in dist/), the exact one preferred.
    """
    if not dist.is_dir():
        raise UsageError(
            f"--dist {dist}: no such directory (valid: a directory of wheels, e.g. the dist/ "
            "that `torchkiln build` fills)"
        )
    torch = _pick(dist, "torch", recipe.torch.version, recipe.python, recipe.torch_wheel_version)
    if torch is None:
        present = ", ".join(p.name for p in sorted(dist.glob("*.whl"))) or "no wheels"
        raise UsageError(
            f"--dist {dist}: no torch {recipe.torch.version} wheel for Python {recipe.python} "
            f"(found: {present}); run `torchkiln build --recipe {recipe.source}` first"
        )
    vision = _pick(
        dist, "torchvision", recipe.torchvision.version, recipe.python, recipe.torchvision_wheel_version
    )
    return Wheels(torch, vision)
