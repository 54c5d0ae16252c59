"""What a torch build says about itself, and whether that matches what its recipe asked for.

A source build can silently lose a feature: CUDA compiled out because nvcc was not found, cuDNN not
picked up, MKL replaced by a fallback BLAS, an arch missing from ``TORCH_CUDA_ARCH_LIST``. The build
still "succeeds". This module turns the build's own report (``torch.__config__.show()`` and the
structured probes next to it) into :class:`BuildFacts`, and compares them with a recipe: every mismatch
is a :class:`Check` that names the expected and the actual value.

Parsing is pure Python (tested without torch); :func:`collect_facts` imports torch when called.
"""

from __future__ import annotations

import importlib.metadata
import platform
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from packaging.version import InvalidVersion, Version

from .archs import expected_arch_list

if TYPE_CHECKING:  # the recipe model is pure Python too, but only its types are needed here
    from torchkiln.recipe import Recipe

SETTINGS_PREFIX = "- Build settings: "
_SPLIT_RE = re.compile(r", (?=[A-Z][A-Z0-9_]*=)")
TRUE_SPELLINGS = frozenset({"1", "ON", "TRUE", "YES", "Y"})
FALSE_SPELLINGS = frozenset({"0", "OFF", "FALSE", "NO", "N", ""})


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


def flag(value: str | None) -> bool | None:
    """Normalise a build-settings boolean (``ON``/``1``/``True``/``OFF``/``0``...); None when absent."""
    if value is None:
        return None
    upper = value.strip().upper()
    if upper in TRUE_SPELLINGS:
        return True
    if upper in FALSE_SPELLINGS:
        return False
    raise ValueError(f"{value!r} is not a boolean build setting (ON/OFF/1/0/TRUE/FALSE)")


def decode_cudnn(version: int | None) -> tuple[int, int, int] | None:
    """``torch.backends.cudnn.version()`` int -> (major, minor, patch).

    cuDNN 9 encodes ``major*10000 + minor*100 + patch`` (91002 = 9.10.2); cuDNN 8 and older
    ``major*1000 + minor*100 + patch`` (8907 = 8.9.7).
    """
    if version is None:
        return None
    if version >= 90000:
        return version // 10000, version // 100 % 100, version % 100
    return version // 1000, version // 100 % 10, version % 100


def dotted(parts: tuple[int, ...] | None) -> str | None:
    return ".".join(str(p) for p in parts) if parts is not None else None


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
    arch_list: tuple[str, ...]
    cxx11_abi: bool
    python_version: str = ""  # "3.12": the interpreter running the build under test
    machine: str = ""  # platform.machine()
    wheel_tags: tuple[str, ...] = ()  # Tag: lines of the installed torch's WHEEL file (empty: not a wheel)
    extra: Mapping[str, Any] = field(default_factory=dict)


def collect_facts() -> BuildFacts:
    """Probe the importable torch. Never initialises a CUDA device (no device is needed)."""
    import torch
    import torch.distributed as dist

    settings = parse_build_settings(torch.__config__.show())
    cudnn_compile = None
    cudnn_mod = getattr(torch._C, "_cudnn", None)
    if cudnn_mod is not None:
        cudnn_compile = tuple(int(p) for p in cudnn_mod.getCompileVersion())  # type: ignore[assignment]
    cudnn_runtime = cudnn_error = None
    if torch.backends.cudnn.is_available():
        try:
            cudnn_runtime = decode_cudnn(torch.backends.cudnn.version())
        except RuntimeError as exc:  # "cuDNN version incompatibility: PyTorch was compiled against ..."
            cudnn_error = str(exc).strip().splitlines()[0]
    nccl_available = bool(dist.is_available() and dist.is_nccl_available())
    nccl_version = None
    if nccl_available:
        nccl_version = tuple(int(p) for p in torch.cuda.nccl.version()[:3])  # type: ignore[assignment]
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
        arch_list=tuple(torch.cuda.get_arch_list()),
        cxx11_abi=bool(torch.compiled_with_cxx11_abi()),
        python_version=f"{sys.version_info.major}.{sys.version_info.minor}",
        machine=platform.machine(),
        wheel_tags=_wheel_tags("torch"),
    )


def _wheel_tags(project: str) -> tuple[str, ...]:
    try:
        text = importlib.metadata.distribution(project).read_text("WHEEL") or ""
    except importlib.metadata.PackageNotFoundError:
        return ()
    return tuple(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:"))


@dataclass(frozen=True)
class Check:
    """One comparison. ``status`` is "pass", "fail" or "skip"; ``message`` says why."""

    id: str
    status: str
    message: str
    expected: Any = None
    actual: Any = None


def _cmp(check_id: str, what: str, expected: Any, actual: Any, ok: bool | None = None) -> Check:
    ok = (expected == actual) if ok is None else ok
    if ok:
        return Check(check_id, "pass", f"{what}: {actual}", expected, actual)
    return Check(check_id, "fail", f"{what}: expected {expected}, actual {actual}", expected, actual)


def _skip(check_id: str, reason: str) -> Check:
    return Check(check_id, "skip", reason)


def _release(version: Version, parts: int) -> tuple[int, ...]:
    return tuple((version.release + (0,) * parts)[:parts])


# --------------------------------------------------------------------------------------------------
# Checks that need no recipe: the build agrees with itself and with what PyTorch's own binary checks
# (smoke_test.py, check_binary.sh) require of every build.
# --------------------------------------------------------------------------------------------------

SELF_CHECKS = (
    "settings_version",
    "settings_cuda",
    "git_version",
    "commit_sha",
    "cxx11_abi",
    "openmp",
    "mkl_runtime",
    "cudnn_settings",
    "cudnn_in_cuda_build",
    "cudnn_runtime",
    "wheel_tag",
)


def self_checks(facts: BuildFacts) -> dict[str, Check]:
    s = facts.settings
    out: dict[str, Check] = {}
    base = Version(facts.torch_version).public
    if "TORCH_VERSION" in s:
        out["settings_version"] = _cmp(
            "settings_version",
            "Build settings TORCH_VERSION vs torch.__version__",
            base,
            s["TORCH_VERSION"],
            ok=Version(s["TORCH_VERSION"]).base_version == Version(base).base_version,
        )
    else:
        out["settings_version"] = Check("settings_version", "fail", "Build settings have no TORCH_VERSION")
    use_cuda = flag(s.get("USE_CUDA"))
    out["settings_cuda"] = _cmp(
        "settings_cuda",
        "USE_CUDA in Build settings, torch.version.cuda and torch.backends.cuda.is_built() agree",
        f"all {'on' if use_cuda else 'off'}",
        f"USE_CUDA={s.get('USE_CUDA')}, torch.version.cuda={facts.cuda_version}, is_built={facts.cuda_built}",
        ok=bool(use_cuda) == (facts.cuda_version is not None) == facts.cuda_built,
    )
    out["git_version"] = _cmp(
        "git_version",
        "torch.version.git_version",
        "a commit, not 'Unknown'",
        facts.git_version,
        ok=facts.git_version not in (None, "", "Unknown"),
    )
    if "COMMIT_SHA" in s and facts.git_version not in (None, "", "Unknown"):
        out["commit_sha"] = _cmp(
            "commit_sha",
            "Build settings COMMIT_SHA vs torch.version.git_version",
            facts.git_version,
            s["COMMIT_SHA"],
        )
    else:
        out["commit_sha"] = _skip("commit_sha", "Build settings carry no COMMIT_SHA to compare")
    out["cxx11_abi"] = _cmp(
        "cxx11_abi", "torch.compiled_with_cxx11_abi() (CXX11 ABI only since 2.7)", True, facts.cxx11_abi
    )
    out["openmp"] = _cmp("openmp", "torch.backends.openmp.is_available()", True, facts.openmp_available)
    if s.get("BLAS_INFO") == "mkl":
        out["mkl_runtime"] = _cmp(
            "mkl_runtime", "BLAS_INFO=mkl but torch.backends.mkl.is_available()", True, facts.mkl_available
        )
    else:
        out["mkl_runtime"] = _skip("mkl_runtime", f"BLAS_INFO={s.get('BLAS_INFO')}: not an MKL build")
    if facts.cudnn_compile is not None and s.get("CUDNN_VERSION"):
        out["cudnn_settings"] = _cmp(
            "cudnn_settings",
            "Build settings CUDNN_VERSION vs compiled cuDNN",
            dotted(facts.cudnn_compile),
            s["CUDNN_VERSION"],
        )
    else:
        out["cudnn_settings"] = _skip("cudnn_settings", "torch was built without cuDNN")
    if facts.cuda_version is not None:  # check_binary.sh: every CUDA build has cuDNN
        out["cudnn_in_cuda_build"] = _cmp(
            "cudnn_in_cuda_build",
            f"cuDNN compiled into a CUDA {facts.cuda_version} build (torch.backends.cudnn.is_available())",
            True,
            facts.cudnn_available,
        )
    else:
        out["cudnn_in_cuda_build"] = _skip("cudnn_in_cuda_build", "not a CUDA build")
    out["cudnn_runtime"] = cudnn_runtime_check(facts)
    out["wheel_tag"] = wheel_tag_check(facts)
    return out


def wheel_tag_check(facts: BuildFacts) -> Check:
    """check_wheel_tags.py: the installed wheel is for this interpreter (cpXY) and this machine."""
    if not facts.wheel_tags:
        return _skip("wheel_tag", "torch is not installed from a wheel (no WHEEL metadata)")
    want = "cp" + facts.python_version.replace(".", "")
    ok = all(
        tag.split("-")[0] == want
        and tag.split("-")[1].startswith(want)
        and tag.split("-")[2].endswith(facts.machine)
        for tag in facts.wheel_tags
    )
    return _cmp(
        "wheel_tag",
        "installed torch wheel tag (python tag, ABI, platform)",
        f"{want}-{want}-*_{facts.machine}",
        ", ".join(facts.wheel_tags),
        ok=ok,
    )


def cudnn_runtime_check(facts: BuildFacts) -> Check:
    """Runtime cuDNN == compile-time cuDNN (smoke_test.py requires equality, not just compatibility)."""
    if not facts.cudnn_available:
        return _skip(
            "cudnn_runtime", "torch was built without cuDNN (torch.backends.cudnn.is_available() is False)"
        )
    if facts.cudnn_error:
        return Check(
            "cudnn_runtime",
            "fail",
            f"torch.backends.cudnn.version() raised: {facts.cudnn_error}",
            dotted(facts.cudnn_compile),
            None,
        )
    return _cmp(
        "cudnn_runtime",
        "runtime cuDNN (torch.backends.cudnn.version()) vs compiled cuDNN",
        dotted(facts.cudnn_compile),
        dotted(facts.cudnn_runtime),
    )


# --------------------------------------------------------------------------------------------------
# Checks against a recipe: the build has what the recipe asked for.
# --------------------------------------------------------------------------------------------------

RECIPE_CHECKS = (
    "torch_version",
    "local_label",
    "build_type",
    "use_cuda",
    "cuda_version",
    "cudnn",
    "nccl",
    "blas",
    "magma",
    "arch_list",
    "git_commit",
    "flags",
    "python",
)


def _version_or_none(text: str | None) -> Version | None:
    if text is None:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None


def recipe_checks(recipe: Recipe, facts: BuildFacts) -> dict[str, Check]:
    """Compare a build with its recipe. Keys are :data:`RECIPE_CHECKS`."""
    s = facts.settings
    acc = recipe.accelerator
    flags = recipe.build.flags
    out: dict[str, Check] = {}
    actual = Version(facts.torch_version)
    wanted = Version(recipe.torch_wheel_version)
    out["torch_version"] = _cmp(
        "torch_version", "torch version (torch.__version__ without local label)", wanted.public, actual.public
    )
    out["local_label"] = _cmp(
        "local_label",
        "torch local version label",
        f"+{wanted.local}" if wanted.local else "(none)",
        f"+{actual.local}" if actual.local else "(none)",
    )
    if "BUILD_TYPE" in s:
        out["build_type"] = _cmp(
            "build_type", "Build settings BUILD_TYPE", recipe.build.type, s["BUILD_TYPE"]
        )
    else:
        out["build_type"] = Check(
            "build_type", "fail", "Build settings have no BUILD_TYPE", recipe.build.type
        )
    use_cuda = bool(flag(s.get("USE_CUDA")))
    out["use_cuda"] = _cmp(
        "use_cuda",
        "USE_CUDA (CUDA compiled in)",
        f"USE_CUDA=ON (recipe asks for CUDA {acc.cuda})" if acc.is_cuda else "USE_CUDA=OFF (CPU recipe)",
        f"USE_CUDA={s.get('USE_CUDA', '(absent)')}, torch.version.cuda={facts.cuda_version}",
        ok=use_cuda == acc.is_cuda and (facts.cuda_version is not None) == acc.is_cuda,
    )
    if acc.is_cuda and acc.cuda is not None:
        got = _version_or_none(facts.cuda_version)
        out["cuda_version"] = _cmp(
            "cuda_version",
            "CUDA version (torch.version.cuda)",
            f"{acc.cuda}",
            facts.cuda_version,
            ok=got is not None and _release(got, 2) == _release(acc.cuda, 2),
        )
    else:
        out["cuda_version"] = _cmp(
            "cuda_version", "CUDA version (torch.version.cuda)", None, facts.cuda_version
        )
    out["cudnn"] = _cudnn_vs_recipe(recipe, facts)
    out["nccl"] = _nccl_vs_recipe(recipe, facts)
    if recipe.blas.kind == "mkl":
        out["blas"] = _cmp(
            "blas",
            "BLAS (Build settings BLAS_INFO, torch.backends.mkl.is_available())",
            "BLAS_INFO=mkl, MKL available",
            f"BLAS_INFO={s.get('BLAS_INFO')}, MKL available={facts.mkl_available}",
            ok=s.get("BLAS_INFO") == "mkl" and facts.mkl_available,
        )
    else:
        # OpenBLAS reports BLAS_INFO=open (cmake/Modules/FindBLAS.cmake).
        out["blas"] = _cmp(
            "blas",
            "BLAS (Build settings BLAS_INFO)",
            "BLAS_INFO=open (OpenBLAS)",
            f"BLAS_INFO={s.get('BLAS_INFO')}",
            ok=s.get("BLAS_INFO", "").startswith("open"),
        )
    magma_wanted = recipe.magma is not None
    out["magma"] = _cmp(
        "magma",
        "MAGMA (torch.cuda.has_magma)",
        f"{magma_wanted} (recipe {'pins MAGMA ' + str(recipe.magma.version) if recipe.magma else 'has no [magma]'})",
        facts.has_magma,
        ok=facts.has_magma == magma_wanted,
    )
    want_archs = expected_arch_list(acc.arch_list) if acc.is_cuda else set()
    got_archs = set(facts.arch_list)
    missing, extra = sorted(want_archs - got_archs), sorted(got_archs - want_archs)
    detail = f" (missing {missing}, unexpected {extra})" if missing or extra else ""
    out["arch_list"] = _cmp(
        "arch_list",
        f"torch.cuda.get_arch_list() vs TORCH_CUDA_ARCH_LIST{detail}",
        sorted(want_archs),
        sorted(got_archs),
        ok=want_archs == got_archs,
    )
    if recipe.torch.commit:
        out["git_commit"] = _cmp(
            "git_commit",
            "torch.version.git_version vs the recipe's pinned commit",
            recipe.torch.commit,
            facts.git_version,
        )
    else:
        out["git_commit"] = _cmp(
            "git_commit",
            "torch.version.git_version",
            "a commit, not 'Unknown'",
            facts.git_version,
            ok=facts.git_version not in (None, "", "Unknown"),
        )
    out["flags"] = _flags_vs_recipe(flags, s)
    if facts.python_version:
        out["python"] = _cmp(
            "python", "Python version running the build", recipe.python, facts.python_version
        )
    else:
        out["python"] = _skip("python", "the Python version was not collected")
    return out


def _cudnn_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Check:
    acc = recipe.accelerator
    if not acc.is_cuda:
        return _cmp(
            "cudnn", "cuDNN compiled in (torch.backends.cudnn.is_available())", False, facts.cudnn_available
        )
    if acc.cudnn is None:
        return _cmp(
            "cudnn", "cuDNN compiled in (torch.backends.cudnn.is_available())", True, facts.cudnn_available
        )
    want = _release(acc.cudnn, 3)
    return _cmp(
        "cudnn",
        "cuDNN compile version (torch._C._cudnn.getCompileVersion())",
        dotted(want),
        dotted(facts.cudnn_compile),
        ok=facts.cudnn_compile == want,
    )


def _nccl_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Check:
    acc, flags = recipe.accelerator, recipe.build.flags
    wanted = acc.is_cuda and flags.get("USE_NCCL", "1") != "0" and flags.get("USE_DISTRIBUTED", "1") != "0"
    if not wanted or acc.nccl is None:
        return _cmp(
            "nccl", "NCCL available (torch.distributed.is_nccl_available())", wanted, facts.nccl_available
        )
    want = _release(acc.nccl, 3)
    return _cmp(
        "nccl",
        "NCCL version (torch.cuda.nccl.version())",
        dotted(want),
        dotted(facts.nccl_version),
        ok=facts.nccl_available and facts.nccl_version == want,
    )


def _flags_vs_recipe(flags: Mapping[str, str], settings: Mapping[str, str]) -> Check:
    """Recipe build flags that PyTorch reports in Build settings (USE_MKLDNN, USE_CUDNN, ...) must match."""
    compared, wrong = [], []
    for key, value in sorted(flags.items()):
        if key not in settings:
            continue  # not every build flag is reported (USE_DISTRIBUTED, BUILD_TEST, ...)
        try:
            want, got = flag(value), flag(settings[key])
        except ValueError:
            want, got = value, settings[key]
        compared.append(key)
        if want != got:
            wrong.append(f"{key}: expected {value}, actual {settings[key]}")
    if not compared:
        return _skip("flags", "none of the recipe's build flags appear in Build settings")
    if wrong:
        return Check("flags", "fail", "build flags differ from the recipe: " + "; ".join(wrong))
    return Check("flags", "pass", f"build flags match the recipe: {', '.join(compared)}")
