"""Whether torchvision's setup.py will find each optional part a recipe asks for, looked up as setup.py does.

torchvision's setup.py decides on each codec (and, up to 0.23, each video decoder) by itself: it looks for
``libpng-config``, for a header, for ``nvjpeg.h`` under CUDA_HOME, for an ``ffmpeg`` binary; a part it does
not find it warns about ("Building torchvision without PNG support") and leaves out, whatever
``TORCHVISION_USE_PNG`` says. The wheel then lacks what the recipe asked for and nothing fails until someone
decodes a PNG. So preflight (:mod:`torchkiln.plan.preflight_libraries`) runs :func:`missing` for every part the recipe
asks for, before anything is fetched, in the environment the ``torchvision:wheel`` step will run in.

Where each part is looked for and what provides it is data (``data/host_tools.toml``, ``[vision_part.NAME]``,
read in torchvision 0.21.0's and main's setup.py); each kind of lookup is one function in :data:`LOOKUPS`,
which follows the setup.py function it names.
"""

from __future__ import annotations

import glob
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from torchkiln.process import runner
from torchkiln.recipe import cmake_options

PROBE_TIMEOUT_S = 20.0

# find_library()'s fixed places on Linux, after TORCHVISION_INCLUDE and the conda prefixes.
SYSTEM_INCLUDE_DIRS = (Path("/usr/include"), Path("/usr/local/include"))
CONDA_PREFIXES = ("BUILD_PREFIX", "CONDA_PREFIX")


@dataclass(frozen=True)
class Setup:
    """What setup.py's lookups read: its environment, its working directory (the torchvision tree: a relative
    prefix is relative to it) and the Python version that runs it."""

    environ: Mapping[str, str]
    cwd: Path
    python: str

    def which(self, tool: str) -> str | None:
        return shutil.which(tool, path=self.environ.get("PATH", os.defpath))

    def dirs(self, variable: str) -> list[Path]:
        """TORCHVISION_INCLUDE / TORCHVISION_LIBRARY as setup.py splits them (os.pathsep)."""
        value = self.environ.get(variable, "")
        return [self.cwd / part for part in value.split(os.pathsep)] if value else []

    def output(self, argv: list[str]) -> str | None:
        """A probe's stripped stdout (setup.py reads stdout only), None when it could not run."""
        try:
            done = runner.run(argv, env=dict(self.environ), timeout=PROBE_TIMEOUT_S)
        except (runner.ProcessError, OSError):
            return None
        return done.stdout.strip()


@dataclass(frozen=True)
class Missing:
    """A part setup.py will not find: what it will find instead, what it looks for, what provides it."""

    part: str
    found: str
    wanted: str
    provides: str


# A lookup: None when setup.py will find the part, else (what it finds instead, what it looks for).
Lookup = Callable[[Mapping[str, Any], Setup], "tuple[str, str] | None"]


def _version(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def _libpng_config(spec: Mapping[str, Any], setup: Setup) -> tuple[str, str] | None:
    """find_libpng(): libpng-config on PATH, its --version at least the minimum, its --I_opts directory
    (the text after the first "-I"). png.h must be there, since the image extension includes it."""
    tool, low, header = spec["tool"], Version(spec["min_version"]), spec["header"]
    wanted = (
        f"{tool} of libpng >= {low} on PATH, with {header} in the directory its --I_opts names (find_libpng)"
    )
    path = setup.which(tool)
    if path is None:
        return f"no {tool} on PATH", wanted
    said = setup.output([path, "--version"])
    version = _version(said)
    if version is None or version < low:
        return f"{path} --version says {said!r}", wanted
    opts = setup.output([path, "--I_opts"]) or ""
    if "-I" not in opts:
        return f"{path} --I_opts names no include directory ({opts!r})", wanted
    include = setup.cwd / opts.split("-I")[1].strip()
    if not (include / header).is_file():
        return f"no {header} in {include} (from {path} --I_opts)", wanted
    return None


def header_dirs(setup: Setup) -> list[Path]:
    """find_library()'s directories, in its order: TORCHVISION_INCLUDE, then $BUILD_PREFIX/include and
    $CONDA_PREFIX/include where the variable is set, then /usr/include and /usr/local/include."""
    dirs = setup.dirs("TORCHVISION_INCLUDE")
    dirs += [setup.cwd / setup.environ[v] / "include" for v in CONDA_PREFIXES if v in setup.environ]
    return dirs + list(SYSTEM_INCLUDE_DIRS)


def _find_library(spec: Mapping[str, Any], setup: Setup) -> tuple[str, str] | None:
    header = spec["header"]
    dirs = header_dirs(setup)
    if any((d / header).exists() for d in dirs):
        return None
    wanted = (
        f"{header} where find_library looks: a torchvision.include_dirs directory (TORCHVISION_INCLUDE), "
        "$BUILD_PREFIX/include, $CONDA_PREFIX/include, /usr/include or /usr/local/include"
    )
    return f"no {header} in {', '.join(str(d) for d in dirs)}", wanted


def cuda_home(setup: Setup) -> str | None:
    """torch.utils.cpp_extension's CUDA_HOME (_find_cuda_home, torch 2.6 to 2.13): $CUDA_HOME or $CUDA_PATH,
    else two levels above the nvcc on PATH, else /usr/local/cuda where it exists."""
    home = setup.environ.get("CUDA_HOME") or setup.environ.get("CUDA_PATH")
    if home is not None:
        return home
    nvcc = setup.which("nvcc")
    if nvcc is not None:
        return os.path.dirname(os.path.dirname(nvcc))
    return "/usr/local/cuda" if os.path.exists("/usr/local/cuda") else None


def _cuda_home(spec: Mapping[str, Any], setup: Setup) -> tuple[str, str] | None:
    """make_image_extension(): ``$CUDA_HOME/include/<header>``, for a CUDA build (FORCE_CUDA=1) only."""
    header = spec["header"]
    wanted = f"{header} in $CUDA_HOME/include (a CUDA build: FORCE_CUDA=1)"
    if setup.environ.get("FORCE_CUDA", "0") != "1":
        return "a build without CUDA (FORCE_CUDA is not 1)", wanted
    home = cuda_home(setup)
    if home is None:
        return "no CUDA_HOME (no $CUDA_HOME, no nvcc on PATH, no /usr/local/cuda)", wanted
    if not (setup.cwd / home / "include" / header).exists():
        return f"no {header} in {home}/include", wanted
    return None


def ffmpeg_include(spec: Mapping[str, Any], setup: Setup) -> list[Path] | tuple[str, str]:
    """make_video_decoders_extensions()'s FFmpeg: its include directories, else (found, wanted). None of
    the video decoders is built with a Python it excludes (3.9), without the ffmpeg binary on PATH, or
    without every library's headers (<lib>/*.h) in its include directories or TORCHVISION_INCLUDE."""
    tool = spec["tool"]
    if setup.python in spec.get("python_excluded", ()):
        return f"Python {setup.python}", f"a Python other than {', '.join(spec['python_excluded'])}"
    wanted = (
        f"{tool} on PATH, with the headers of {', '.join(spec['libraries'])} (<lib>/*.h) in its prefix's "
        "include/ (or include/<multiarch>) or a torchvision.include_dirs directory"
    )
    path = setup.which(tool)
    if path is None:
        return f"no {tool} on PATH", wanted
    include = Path(os.path.dirname(os.path.dirname(path))) / "include"
    cc = setup.environ["CC"] if "CC" in setup.environ else setup.which("gcc")
    multiarch = setup.output([cc, "-print-multiarch"]) if cc else None
    dirs = [include, include / multiarch] if multiarch else [include]
    searched = dirs + setup.dirs("TORCHVISION_INCLUDE")
    absent = [lib for lib in spec["libraries"] if not any(glob.glob(str(d / lib / "*.h")) for d in searched)]
    if absent:
        return f"no headers of {', '.join(absent)} in {', '.join(str(d) for d in searched)}", wanted
    return dirs


def _ffmpeg(spec: Mapping[str, Any], setup: Setup) -> tuple[str, str] | None:
    found = ffmpeg_include(spec, setup)
    return found if isinstance(found, tuple) else None


def _gpu_decoder(spec: Mapping[str, Any], setup: Setup) -> tuple[str, str] | None:
    """The GPU video decoder: FFmpeg as above, a CUDA build with a CUDA_HOME, the Video Codec SDK's headers
    in TORCHVISION_INCLUDE, its library in TORCHVISION_LIBRARY, and FFmpeg's bsf.h in FFmpeg's directories."""
    found = ffmpeg_include(spec, setup)
    if isinstance(found, tuple):
        return found
    wanted = (
        f"a CUDA build, {', '.join(spec['headers'])} in a torchvision.include_dirs directory, "
        f"{', '.join(spec['library_files'])} in a torchvision.library_dirs directory, "
        f"{', '.join(spec['ffmpeg_headers'])} in FFmpeg's include directories"
    )
    if setup.environ.get("FORCE_CUDA", "0") != "1" or cuda_home(setup) is None:
        return "a build without CUDA (FORCE_CUDA is not 1, or no CUDA_HOME)", wanted
    places = [
        (spec["headers"], setup.dirs("TORCHVISION_INCLUDE"), "TORCHVISION_INCLUDE"),
        (spec["library_files"], setup.dirs("TORCHVISION_LIBRARY"), "TORCHVISION_LIBRARY"),
        (spec["ffmpeg_headers"], found, "FFmpeg's include directories"),
    ]
    absent = [
        f"{name} in {where}"
        for names, dirs, where in places
        for name in names
        if not any((d / name).exists() for d in dirs)
    ]
    return (f"no {'; no '.join(absent)}", wanted) if absent else None


LOOKUPS: dict[str, Lookup] = {
    "libpng-config": _libpng_config,
    "find_library": _find_library,
    "cuda_home": _cuda_home,
    "ffmpeg": _ffmpeg,
    "gpu_decoder": _gpu_decoder,
}


def missing(part: str, setup: Setup) -> Missing | None:
    """What setup.py will find instead of ``part`` (a name of :class:`~torchkiln.recipe.model.VisionFeatures`),
    or None when it will find it."""
    spec = cmake_options.vision_part(part)
    result = LOOKUPS[spec["lookup"]](spec, setup)
    if result is None:
        return None
    found, wanted = result
    return Missing(part, found, wanted, spec["provides"])
