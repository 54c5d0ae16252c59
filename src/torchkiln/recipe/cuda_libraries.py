"""Where a CUDA wheel's CUDA libraries come from on the machine it is installed on (``[deploy] cuda_libraries``).

``pypi`` (the default), as upstream's PyPI wheels: the torch wheel declares NVIDIA's PyPI wheels
(:func:`requirements`, what the build sets as PYTORCH_EXTRA_INSTALL_REQUIREMENTS) and its shared objects find
them through RPATH entries into site-packages (:func:`lib_dirs`, what the ``torch:repair`` step of the
plan writes). ``bundled``: the wheel carries them (upstream's "-full" variant, only where upstream ships one:
:func:`bundled_cuda`). The data and where each number comes from: ``data/compat.toml`` ``[cuda_libraries]``.

The invariant: a CUDA torch wheel installed with plain ``pip install`` on a machine with nothing but a Python and
the driver loads every CUDA library it links, from the wheels pip brought for its own Requires-Dist (pypi) or
from itself (bundled), never from a toolkit that happened to be on the build host.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .compat import compat, minor
from .model import Recipe

MODES = ("pypi", "bundled")
FIELD = "deploy.cuda_libraries"
_MAJOR_SUFFIX = re.compile(r"-cu\d+$")


def _data() -> dict[str, Any]:
    data: dict[str, Any] = compat()["cuda_libraries"]
    return data


def bundled_cuda(torch_minor: str) -> str | None:
    """The CUDA minor upstream built torch ``torch_minor``'s bundled ("-full") wheel for; None: none."""
    found: str | None = _data()["bundled"].get(torch_minor)
    return found


def _bundled_pairs() -> str:
    return ", ".join(f"torch {t} with CUDA {c}" for t, c in _data()["bundled"].items())


def _category(name: str) -> str:
    """What a requirement of upstream's list is: cudnn, nccl, toolkit (a CUDA toolkit component or the
    cuda-toolkit meta package), major (per CUDA major: cuda-bindings, cuSPARSELt, NVSHMEM) or other (triton)."""
    bare = _MAJOR_SUFFIX.sub("", name)
    if bare in ("nvidia-cudnn", "nvidia-nccl"):
        return bare.removeprefix("nvidia-")
    if name == "cuda-toolkit" or bare in _data()["components"]:
        return "toolkit"
    if name.startswith(("nvidia-", "cuda-")):
        return "major"
    return "other"


def _with(req: Requirement, name: str, specifier: str) -> str:
    """``req`` as ``name`` pinned to ``specifier``, its marker kept."""
    marker = f"; {req.marker}" if req.marker else ""
    return f"{name}{specifier}{marker}"


def requirements(recipe: Recipe) -> tuple[str, ...]:
    """The Requires-Dist lines a ``pypi`` CUDA recipe's torch wheel gets (PYTORCH_EXTRA_INSTALL_REQUIREMENTS, one
    string per line); empty for a CPU recipe, a ``bundled`` one, or one the rules refuse (:func:`problems`).

    The release's row (upstream's wheel of that release) when its CUDA is the recipe's, else the CUDA's
    cuda-toolkit pin with the row's extras and the row's lines of the same CUDA major; in both, cuDNN and
    NCCL at the recipe's own pins (what the build links), triton as upstream pins it."""
    acc = recipe.accelerator
    if not acc.is_cuda or acc.cuda is None or recipe.deploy.cuda_libraries != "pypi":
        return ()
    data = _data()
    row = data["release"].get(minor(recipe.torch.version))
    cuda, major = minor(acc.cuda), acc.cuda.major
    if row is None or (row["cuda"] != cuda and cuda not in data["toolkit"]):
        return ()
    same_cuda = row["cuda"] == cuda
    same_major = row["cuda"].split(".")[0] == str(major)
    parsed = [Requirement(line) for line in row["requires"]]
    out: list[str] = []
    if not same_cuda:
        extras = next((sorted(r.extras) for r in parsed if r.name == "cuda-toolkit"), data["extras"])
        out.append(f'cuda-toolkit[{",".join(extras)}]=={data["toolkit"][cuda]}; platform_system == "Linux"')
    # the packages the wheel runs with: accelerator.cudnn_runtime / nccl_runtime where a recipe says the build
    # ships newer libraries than it compiled against (upstream's 2.8.0), else the compiled ones
    pins = {"cudnn": acc.cudnn_shipped, "nccl": acc.nccl_shipped}
    for req in parsed:
        category = _category(canonicalize_name(req.name))
        if category in pins:
            pin = pins[category]
            if pin is not None:
                out.append(_with(req, f"nvidia-{category}-cu{major}", f"=={pin}"))
        elif (
            category == "other"
            or (category == "toolkit" and same_cuda)
            or (category == "major" and same_major)
        ):
            out.append(str(req))
    return tuple(out)


def extra_install_requirements(recipe: Recipe) -> str | None:
    """PYTORCH_EXTRA_INSTALL_REQUIREMENTS as torch's setup.py and its scikit-build-core metadata provider read
    it ('|' between PEP 508 strings); None where nothing is declared."""
    lines = requirements(recipe)
    return " | ".join(lines) if lines else None


def lib_dirs(recipe: Recipe) -> tuple[str, ...]:
    """Where NVIDIA's wheels of the recipe's CUDA major put their libraries, relative to site-packages (the
    RPATH entries every shared object of a ``pypi`` torch wheel gets); empty where nothing is rewritten."""
    acc = recipe.accelerator
    if not acc.is_cuda or acc.cuda is None or recipe.deploy.cuda_libraries != "pypi":
        return ()
    return tuple(_data()["lib_dirs"].get(str(acc.cuda.major), ()))


def bundle_extra(recipe: Recipe) -> tuple[str, ...]:
    """The libraries a ``bundled`` wheel carries that no NEEDED entry names (loaded with dlopen)."""
    acc = recipe.accelerator
    if acc.cuda is None:
        return ()
    return tuple(_data()["bundle_extra"].get(str(acc.cuda.major), ()))


def problems(recipe: Recipe) -> Iterator[tuple[str, str, str]]:
    """Why the recipe's ``cuda_libraries`` cannot be done as upstream does it: (field, what, valid)."""
    acc, mode = recipe.accelerator, recipe.deploy.cuda_libraries
    torch_minor = minor(recipe.torch.version)
    if not acc.is_cuda or acc.cuda is None:
        if mode == "bundled":
            yield (
                FIELD,
                "a CPU recipe has no CUDA libraries to bundle",
                "pypi (the default), or a CUDA recipe",
            )
        return
    cuda = minor(acc.cuda)
    data = _data()
    if mode == "bundled":
        if bundled_cuda(torch_minor) != cuda:
            yield (
                FIELD,
                f"upstream ships no wheel of torch {torch_minor} for CUDA {cuda} that bundles its CUDA libraries",
                f"pypi (upstream's PyPI wheels); bundled only as upstream built it: {_bundled_pairs()}",
            )
        return
    row = data["release"].get(torch_minor)
    if row is None:
        return  # an unknown release: the torch-known rule says so
    if row["cuda"] != cuda and cuda not in data["toolkit"]:
        yield (
            FIELD,
            f"no NVIDIA PyPI wheel pins known for CUDA {cuda}, so the wheel could not declare its CUDA libraries",
            f"a CUDA of {', '.join(data['toolkit'])} (data/compat.toml [cuda_libraries.toolkit])",
        )
    if str(acc.cuda.major) not in data["lib_dirs"]:
        yield (
            FIELD,
            f"no layout of NVIDIA's CUDA {acc.cuda.major} wheels known, so the wheel could not find them",
            f"CUDA {', '.join(data['lib_dirs'])}.x",
        )
