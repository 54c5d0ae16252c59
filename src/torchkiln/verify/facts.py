"""What an installed torch (and torchvision) says about how it was built: collected once, as plain data.

Two places need these facts and must read them the same way: the verification suite (in the process that
imports torch) and the build's post-build check (in a clean virtualenv of the recipe's Python, where
torchkiln itself is not installed). So this module is **standard library only** and runs as a script:
``python facts.py`` prints the facts as one JSON object, and :func:`BuildFacts.from_json` reads them back.
The comparison with a recipe lives in :mod:`torchkiln.verify.buildconfig`, in one place for both.

What torch reports, and where (checked on upstream's 2.13.0+cu130 / 2.14.0+cu130 and 2.13.0+cpu wheels):

* ``torch.__config__.show()``: ``GCC 13.3``, ``Intel(R) oneAPI Math Kernel Library Version 2024.2-Product
  Build ...``, and the ``Build settings:`` line (``KEY=VALUE, `` pairs in key order, empty values left out);
* ``torch.version.cuda`` (``'13.0'``), ``torch.version.git_version``, ``torch.cuda.has_magma``;
* the arch list the build compiled for: ``torch._C._cuda_getArchFlags()`` (``'sm_75 sm_80 ... sm_120'``;
  ``compute_XY`` only when PTX was built), not ``torch.cuda.get_arch_list()`` (see :func:`compiled_arch_list`);
* cuDNN: ``torch._C._cudnn.getCompileVersion()`` and ``torch.backends.cudnn.version()`` (``92000`` for
  9.20.0), NCCL: ``torch.cuda.nccl.version()`` -- all readable without a GPU;
* torchvision: ``torchvision.version.cuda`` is an **int** (``13000`` for CUDA 13.0, set only for CUDA
  builds), ``torchvision.extension._check_cuda_version()`` the same int (0 or less for CPU builds); its ops
  live in ``_C.so`` (0.28) or ``_C_stable.so`` (0.29, built on torch's stable ABI);
* torchvision's optional parts (:func:`probe_parts`): each codec used once; one built without raises
  ``encode_png: torchvision not compiled with libpng support`` (torchvision/csrc/io/image/cpu/*.cpp and
  cuda/*.cpp, 0.21.0 and 0.28.0: libpng, libPNG, libjpeg, libwebp, nvJPEG); the video decoders are
  ``torchvision.io._HAS_CPU_VIDEO_DECODER`` / ``_HAS_GPU_VIDEO_DECODER`` (up to 0.23).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import json
import os
import platform
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SETTINGS_PREFIX = "- Build settings: "
_SPLIT_RE = re.compile(r", (?=[A-Z][A-Z0-9_]*=)")
_COMPILER_RE = re.compile(r"^- (GCC|clang) (\d+(?:\.\d+)*)", re.ASCII)
_MKL_RE = re.compile(r"Math Kernel Library Version (\d+(?:\.\d+)*)", re.ASCII)
# nvcc's "-gencode arch=compute_75,code=sm_75" (a cubin) / "code=compute_120" (PTX), as CUDA_FLAGS spells them
_GENCODE_RE = re.compile(r"-gencode[= ]arch=compute_\w+,code=((?:sm|compute)_\w+)", re.ASCII)
# The NVIDIA PyPI distributions whose versions smoke_test.py's --pypi-pkg-check compares with torch's own.
NVIDIA_DISTS = ("nvidia-cudnn-cu12", "nvidia-cudnn-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu13")


def parse_build_settings(show: str) -> dict[str, str]:
    """The ``Build settings`` line of ``torch.__config__.show()`` as a dict.

    PyTorch prints ``KEY=VALUE, `` pairs in key order with a trailing ``", "``, omits empty values, and
    values such as CXX_FLAGS contain commas and spaces, so split only before ``, KEY=``.
    Raises ValueError when there is no Build settings line (not the output of show()).
    """
    for line in show.splitlines():
        stripped = line.strip()
        if stripped.startswith(SETTINGS_PREFIX):
            body = stripped[len(SETTINGS_PREFIX) :].rstrip()
            body = body.removesuffix(",")
            settings: dict[str, str] = {}
            for item in _SPLIT_RE.split(body):
                if not item:
                    continue
                key, sep, value = item.partition("=")
                if not sep:
                    raise ValueError(f"Build settings item {item!r} is not KEY=VALUE")
                settings[key.strip()] = value.strip()
            return settings
    raise ValueError("no '- Build settings:' line in torch.__config__.show() output")


def parse_compiler(show: str) -> str | None:
    """``GCC 13.3`` (the host compiler torch was built with) from show(), or None."""
    for line in show.splitlines():
        match = _COMPILER_RE.match(line.strip())
        if match:
            return f"{match[1]} {match[2]}"
    return None


def parse_mkl_version(show: str) -> str | None:
    """``2024.2`` from show()'s ``Intel(R) oneAPI Math Kernel Library Version 2024.2-Product Build``."""
    match = _MKL_RE.search(show)
    return match[1] if match else None


def gencode_archs(cuda_flags: str) -> tuple[str, ...]:
    """``('sm_75', ..., 'compute_120')`` from the ``-gencode`` flags of Build settings' ``CUDA_FLAGS``, in
    their order, each once. Empty for a CPU build (its CUDA_FLAGS carry no ``-gencode``)."""
    return tuple(dict.fromkeys(_GENCODE_RE.findall(cuda_flags)))


def compiled_arch_list(torch: Any, settings: Mapping[str, str]) -> tuple[tuple[str, ...], str]:
    """The CUDA arch list the build recorded, and where it was read. Needs no device.

    Not ``torch.cuda.get_arch_list()``: through 2.12 it starts with ``if not is_available(): return []``
    (upstream's 2.6.0 source and 2.12.1+cu130 wheel; 2.13.0 and 2.14.x gate on ``_is_compiled()``), so
    on a machine without a usable GPU a correct CUDA build would lack every arch. Both read
    ``torch._C._cuda_getArchFlags()``: the readable form of the flags torch/CMakeLists.txt compiles into
    torch/csrc/cuda/Module.cpp as ``CUDA_ARCH_FLAGS`` (``torch_cuda_get_nvcc_gencode_flag``, the same macro
    that appends the ``-gencode`` flags to ``CUDA_FLAGS``). A CUDA build always has it; should it not, the
    ``-gencode`` flags of Build settings are the same record. A CPU build has neither: ``()``.
    """
    read = getattr(torch._C, "_cuda_getArchFlags", None)
    flags = read() if read is not None else None
    if flags is not None:
        return tuple(str(flags).split()), "torch._C._cuda_getArchFlags()"
    return gencode_archs(settings.get("CUDA_FLAGS", "")), "the -gencode flags of Build settings CUDA_FLAGS"


def decode_cudnn(version: int | None) -> tuple[int, int, int] | None:
    """``torch.backends.cudnn.version()`` int -> (major, minor, patch).

    cuDNN 9 encodes ``major*10000 + minor*100 + patch`` (92000 = 9.20.0); cuDNN 8 and older
    ``major*1000 + minor*100 + patch`` (8907 = 8.9.7).
    """
    if version is None:
        return None
    if version >= 90000:
        return version // 10000, version // 100 % 100, version % 100
    return version // 1000, version // 100 % 10, version % 100


def decode_torchvision_cuda(value: int | str | None) -> str | None:
    """torchvision's CUDA version (``torchvision.version.cuda``, an int such as 13000 or 12060) as torch
    spells it (``'13.0'``, ``'12.6'``). torchvision computes it as ``major * 1000 + minor * 10``
    (torchvision/csrc/vision.cpp ``cuda_version``); 0 or less: not a CUDA build."""
    if value is None:
        return None
    if isinstance(value, str):  # older releases exposed torch's string
        return value or None
    if value <= 0:
        return None
    return f"{value // 1000}.{value % 1000 // 10}"


# What a codec torchvision was built without says when used (see the module's docstring).
NOT_COMPILED = re.compile(r"not compiled with (lib)?(png|jpeg|webp|nvjpeg) support", re.IGNORECASE)
# A 2x2 lossless WebP: red, green / blue, white (written by Pillow's libwebp encoder).
WEBP_2X2 = bytes.fromhex(
    "524946462c000000574542505650384c1f0000002f014000001f201048de1f3a8df9171014fc1fddfc47640fe0060c11fd0f0100"
)
# An 8x8 baseline JPEG of one colour (200, 40, 90), written by Pillow 13.0.0 (quality 50): what the nvJPEG
# probe hands the GPU decoder, so that it needs no libjpeg to make one.
JPEG_8X8 = bytes.fromhex(
    "ffd8ffe000104a46494600010100000100010000ffdb004300100b0c0e0c0a100e0d0e1211101318281a181616183123251d283a"
    "333d3c3933383740485c4e404457453738506d51575f626768673e4d71797064785c656763ffdb0043011112121815182f1a1a2f"
    "634238426363636363636363636363636363636363636363636363636363636363636363636363636363636363636363636363"
    "636363ffc00011080008000803012200021101031101ffc4001500010100000000000000000000000000000005ffc4001410010000"
    "0000000000000000000000000000ffc4001501010100000000000000000000000000000106ffc4001411010000000000000000000000"
    "0000000000ffda000c03010002110311003f009c00523fffd9"
)


def dotted(parts: tuple[int, ...] | list[int] | None) -> str | None:
    return ".".join(str(p) for p in parts) if parts is not None else None


@dataclass(frozen=True)
class TorchvisionFacts:
    """What an installed torchvision reports. ``error``: importing it (or loading its ops) failed."""

    version: str | None = None
    git_version: str | None = None
    cuda: str | None = None  # decoded to torch's spelling: '13.0'
    cuda_raw: int | str | None = None  # as torchvision reports it: 13000
    has_ops: bool = False  # its C++ ops library loaded (torchvision.extension._has_ops())
    extensions: tuple[str, ...] = ()  # the ops/codec libraries it ships: _C.so, _C_stable.so, image.so ...
    error: str | None = None
    # Its optional parts ([torchvision.features] names): True built in, False built without, None could
    # not tell (e.g. the image extension did not load); ``part_notes`` what the probe said. Empty: facts
    # from a torchkiln that did not probe them.
    parts: Mapping[str, bool | None] = field(default_factory=dict)
    part_notes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BuildFacts:
    """Everything the build-config checks look at, gathered once from the importable torch."""

    torch_version: str
    git_version: str | None
    settings: Mapping[str, str]
    cuda_version: str | None  # torch.version.cuda
    cuda_built: bool  # torch.backends.cuda.is_built()
    cudnn_available: bool  # torch.backends.cudnn.is_available()
    cudnn_compile: tuple[int, int, int] | None  # torch._C._cudnn.getCompileVersion()
    cudnn_runtime: tuple[int, int, int] | None  # torch.backends.cudnn.version()
    cudnn_error: str | None  # the compatibility check raised (runtime does not match compile)
    nccl_available: bool
    nccl_version: tuple[int, int, int] | None
    mkl_available: bool
    openmp_available: bool
    has_magma: bool
    arch_list: tuple[str, ...]  # what the build compiled for (compiled_arch_list), with or without a device
    cxx11_abi: bool
    python_version: str = ""  # "3.12": the interpreter running the build under test
    machine: str = ""  # platform.machine()
    wheel_tags: tuple[str, ...] = ()  # Tag: lines of the installed torch's WHEEL file (empty: not a wheel)
    compiler: str | None = None  # "GCC 13.3" from torch.__config__.show()
    mkl_version: str | None = None  # "2024.2" from torch.__config__.show()
    nvidia_dists: Mapping[str, str] = field(default_factory=dict)  # installed nvidia-cudnn/nccl-cuXX
    arch_source: str = "torch._C._cuda_getArchFlags()"  # where arch_list was read (compiled_arch_list)
    torchvision: TorchvisionFacts | None = None  # None: torchvision is not installed
    extra: Mapping[str, Any] = field(default_factory=dict)
    nccl_error: str | None = None  # torch.cuda.nccl.version() raised (the library is not usable)
    # The NCCL the process runs with: ncclGetVersion() of the libnccl this process loaded (None: none loaded,
    # NCCL linked statically or not at all). torch.cuda.nccl.version() is the NCCL torch was compiled against
    # (torch/csrc/cuda/nccl.cpp version(): NCCL_MAJOR/MINOR/PATCH of the nccl.h it was built with).
    nccl_runtime: tuple[int, int, int] | None = None
    distributed: bool | None = None  # torch.distributed.is_available() (USE_DISTRIBUTED); None: not collected
    # Read from torch's ELF files by torchkiln.verify.linkage (pyelftools: the verification suite fills them,
    # this script cannot): libtorch_cuda.so's NEEDED libnccl entry (None: none) and where it resolves with
    # LD_LIBRARY_PATH unset (None: nowhere); how MAGMA is linked into the CUDA linear-algebra library
    # ("static in torch/lib/libtorch_cuda_linalg.so", "libmagma.so (NEEDED by ...)"; None: not at all).
    libraries_read: bool = False
    nccl_needed: str | None = None
    nccl_path: str | None = None
    magma_linkage: str | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BuildFacts:
        """The inverse of :meth:`to_json` (tuples come back from JSON lists). Unknown keys are ignored,
        so facts written by another torchkiln version still load."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for key in ("cudnn_compile", "cudnn_runtime", "nccl_version", "nccl_runtime"):
            if values.get(key) is not None:
                values[key] = tuple(values[key])
        for key in ("arch_list", "wheel_tags"):
            values[key] = tuple(values.get(key) or ())
        vision = values.get("torchvision")
        if vision is not None:
            vision = dict(vision)
            vision["extensions"] = tuple(vision.get("extensions") or ())
            values["torchvision"] = TorchvisionFacts(**vision)
        return cls(**values)

    @classmethod
    def from_json(cls, text: str) -> BuildFacts:
        return cls.from_dict(json.loads(text))


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _wheel_tags(project: str) -> tuple[str, ...]:
    try:
        text = importlib.metadata.distribution(project).read_text("WHEEL") or ""
    except importlib.metadata.PackageNotFoundError:
        return ()
    return tuple(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:"))


def decode_nccl(code: int) -> tuple[int, int, int]:
    """``ncclGetVersion()``'s int -> (major, minor, patch): ``major*10000 + minor*100 + patch`` from NCCL 2.9
    on, ``major*1000 + minor*100 + patch`` before (nccl.h.in ``NCCL_VERSION``)."""
    if code >= 10000:
        return code // 10000, code // 100 % 100, code % 100
    return code // 1000, code // 100 % 10, code % 100


def loaded_nccl_version(maps: str | None = None) -> tuple[int, int, int] | None:
    """The version of the libnccl this process has loaded (torch's libtorch_cuda.so loads it at import),
    asked of that very library (``ncclGetVersion``, no device needed). None when no libnccl is loaded (a
    static NCCL, none at all) or the library cannot answer. ``maps``: /proc/self/maps' text (tests)."""
    import ctypes

    if maps is None:
        try:
            maps = open("/proc/self/maps", encoding="utf-8", errors="replace").read()  # noqa: SIM115
        except OSError:
            return None
    paths = sorted({line.split()[-1] for line in maps.splitlines() if "/libnccl.so" in line})
    for path in paths:
        try:
            library = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            code = ctypes.c_int(0)
            if library.ncclGetVersion(ctypes.byref(code)) == 0 and code.value > 0:
                return decode_nccl(code.value)
        except (OSError, AttributeError):
            continue
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _codec_probes(torchvision: Any) -> dict[str, Any]:
    """part -> a call that uses it once (``image`` ops; the GPU decoder through its op, as torchvision.io
    calls it for ``device='cuda'``)."""
    import torch

    def image(data: bytes) -> Any:
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)

    def nvjpeg() -> Any:
        decode = torch.ops.image.decode_jpegs_cuda  # raises when the image extension is not loaded
        return decode([image(JPEG_8X8)], 0, torch.device("cuda"))

    return {
        "png": lambda: torchvision.io.encode_png(torch.zeros(1, 2, 2, dtype=torch.uint8)),
        "jpeg": lambda: torchvision.io.encode_jpeg(torch.zeros(3, 8, 8, dtype=torch.uint8)),
        "webp": lambda: torchvision.io.decode_webp(image(WEBP_2X2)),
        "nvjpeg": nvjpeg,
    }


def probe_parts(torchvision: Any) -> tuple[dict[str, bool | None], dict[str, str]]:
    """Which optional parts the imported torchvision was built with: each codec used once. A codec built
    without says so (:data:`NOT_COMPILED`); any other failure leaves it unknown, except for nvJPEG, whose
    op without a GPU fails in CUDA, past the "not compiled" test (so reaching CUDA means it is built in)."""
    parts: dict[str, bool | None] = {}
    notes: dict[str, str] = {}
    for part, use in _codec_probes(torchvision).items():
        try:
            use()
        except (AttributeError, RuntimeError) as exc:
            notes[part] = _first_line(exc)
            reached_cuda = part == "nvjpeg" and not isinstance(exc, AttributeError)
            parts[part] = False if NOT_COMPILED.search(str(exc)) else (True if reached_cuda else None)
        except Exception as exc:  # noqa: BLE001 - torch.AcceleratorError and the like: the op ran
            notes[part] = _first_line(exc)
            parts[part] = True if part == "nvjpeg" else None
        else:
            parts[part] = True
    io = getattr(torchvision, "io", None)
    parts["ffmpeg"] = bool(getattr(io, "_HAS_CPU_VIDEO_DECODER", False))
    parts["video_codec"] = bool(getattr(io, "_HAS_GPU_VIDEO_DECODER", False))
    return parts, notes


def collect_torchvision() -> TorchvisionFacts | None:
    """The installed torchvision's facts; None when it is not installed. Never raises: an import or ops
    failure ("operator torchvision::nms does not exist") is recorded in ``error``."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:
        return None
    try:
        import torchvision
    except Exception as exc:  # noqa: BLE001 - e.g. built against another torch
        return TorchvisionFacts(error=f"import torchvision failed: {type(exc).__name__}: {exc}")
    from pathlib import Path

    package = Path(torchvision.__file__).parent
    extensions = tuple(sorted(p.name.split(".")[0] for p in package.glob("*.so")))
    version_mod = getattr(torchvision, "version", None)
    raw = getattr(version_mod, "cuda", None)
    error = None
    has_ops = False
    try:
        from torchvision import extension

        has_ops = bool(extension._has_ops())
        if raw is None:
            raw = extension._check_cuda_version()
    except Exception as exc:  # noqa: BLE001 - a CUDA mismatch raises here ("compiled with different CUDA")
        error = f"{type(exc).__name__}: {exc}"
    parts, notes = probe_parts(torchvision)
    return TorchvisionFacts(
        version=str(torchvision.__version__),
        git_version=getattr(version_mod, "git_version", None),
        cuda=decode_torchvision_cuda(raw),
        cuda_raw=raw,
        has_ops=has_ops,
        extensions=extensions,
        error=error,
        parts=parts,
        part_notes=notes,
    )


def collect_facts() -> BuildFacts:
    """Probe the importable torch (and torchvision). Never initialises a CUDA device (none is needed)."""
    import torch
    import torch.distributed as dist

    show = torch.__config__.show()
    settings = parse_build_settings(show)
    cudnn_compile = None
    cudnn_mod = getattr(torch._C, "_cudnn", None)
    if cudnn_mod is not None:
        cudnn_compile = tuple(int(p) for p in cudnn_mod.getCompileVersion())
    cudnn_runtime = cudnn_error = None
    if torch.backends.cudnn.is_available():
        try:
            cudnn_runtime = decode_cudnn(torch.backends.cudnn.version())
        except RuntimeError as exc:  # "cuDNN version incompatibility: PyTorch was compiled against ..."
            cudnn_error = str(exc).strip().splitlines()[0]
    nccl_available = bool(dist.is_available() and dist.is_nccl_available())
    arch_list, arch_source = compiled_arch_list(torch, settings)
    nccl_version = None
    nccl_error: str | None = None
    if nccl_available:
        try:
            nccl_version = tuple(int(p) for p in torch.cuda.nccl.version()[:3])
        except (RuntimeError, AttributeError, OSError) as exc:  # a libnccl without ncclGetVersion, or none
            nccl_error = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    return BuildFacts(
        torch_version=str(torch.__version__),
        git_version=torch.version.git_version,
        settings=settings,
        cuda_version=torch.version.cuda,
        cuda_built=bool(torch.backends.cuda.is_built()),
        cudnn_available=bool(torch.backends.cudnn.is_available()),
        cudnn_compile=cudnn_compile,  # type: ignore[arg-type]
        cudnn_runtime=cudnn_runtime,
        cudnn_error=cudnn_error,
        nccl_available=nccl_available,
        nccl_version=nccl_version,  # type: ignore[arg-type]
        mkl_available=bool(torch.backends.mkl.is_available()),
        openmp_available=bool(torch.backends.openmp.is_available()),
        has_magma=bool(torch.cuda.has_magma),
        arch_list=arch_list,
        arch_source=arch_source,
        cxx11_abi=bool(torch.compiled_with_cxx11_abi()),
        python_version=f"{sys.version_info.major}.{sys.version_info.minor}",
        machine=platform.machine(),
        wheel_tags=_wheel_tags("torch"),
        compiler=parse_compiler(show),
        mkl_version=parse_mkl_version(show),
        nvidia_dists={n: v for n in NVIDIA_DISTS if (v := _dist_version(n)) is not None},
        torchvision=collect_torchvision(),
        nccl_error=nccl_error,
        nccl_runtime=loaded_nccl_version() if nccl_available else None,
        distributed=bool(dist.is_available()),
    )


WAIT = "--import-torch-then-wait"  # the post-build check's early start (torchkiln.build.postcheck)
RESTART = "facts.py: restart"  # the early start's answer when what it imported may have changed


class _Misses:
    """The last finder on ``sys.meta_path``: asked only for what no other finder found, it remembers the
    top-level names that were looked for and not there."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        self.names.add(name.partition(".")[0])


def _import_early(modules: list[str]) -> tuple[set[str], bool]:
    """torch imported, then each of ``modules`` (torch's own): the top-level names looked for and missed
    meanwhile, and whether every one of ``modules`` imported (one that raised leaves a state a fresh
    interpreter never has: then only a fresh interpreter's facts count)."""
    misses = _Misses()
    sys.meta_path.append(misses)
    try:
        import torch  # noqa: F401 - imported while pip installs the checked wheels

        whole = True
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - a fresh interpreter meets the error where it arises
                whole = False
    finally:
        sys.meta_path.remove(misses)
    return misses.names, whole


def main(argv: list[str] | None = None) -> int:
    """``python facts.py``: the facts of the torch this interpreter imports, as one JSON line.

    ``python facts.py --import-torch-then-wait [MODULE ...]``: torch is imported first, then each MODULE (one
    of torch's own that the checked wheels' import reaches: the post-build check's ``WARM_UP``), then one line
    is read from stdin, ``go`` and the top-level names of the distributions installed meanwhile. When the
    imports looked for none of them (:class:`_Misses`) and each MODULE imported, the facts are collected as
    above, the import caches invalidated first; otherwise it prints :data:`RESTART` (a fresh interpreter
    would find what this one did not). Anything else (end of input) exits without a word. The post-build
    check starts it before its pip install. The facts read torch's build configuration and the checked
    wheels' ops, which do not depend on whether a torch module was imported before the wheels or by them."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == [WAIT]:
        foreign = [name for name in args[1:] if not name.startswith("torch.")]
        if foreign:
            print(f"facts.py: {WAIT} imports only torch's modules (torch.*), not {foreign}", file=sys.stderr)
            return 2
        missed, whole = _import_early(args[1:])
        words = sys.stdin.readline().split()
        if words[:1] != ["go"]:
            return 0
        if not whole or missed & set(words[1:]):
            print(RESTART)
            return 0
        importlib.invalidate_caches()
    elif args:
        print(
            f"facts.py: unknown arguments {args} (valid: none, or {WAIT} [torch.MODULE ...])", file=sys.stderr
        )
        return 2
    print(collect_facts().to_json())
    return 0


def finish(code: int) -> None:
    """End a run of this script once its answer is written: the streams flushed, then the process ended
    without the interpreter's teardown. With torch and ``torch._dynamo`` imported that teardown (freeing
    every module, nothing the answer needs) took 0.67 s of a check's 2.4 s, measured in the real
    torchvision 0.21.0 check venv against torch 2.13.0+cpu: the import 1.74 s, the import then exit 2.41 s.
    No thread or child process of this script outlives it: torch's import starts none."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover - run by the build's post-build check
    finish(main())
