"""Whether a torch build is what its recipe asked for, and agrees with itself.

A source build can silently lose a feature: CUDA compiled out because nvcc was not found, cuDNN not
picked up, MKL replaced by a fallback BLAS, an arch missing from ``TORCH_CUDA_ARCH_LIST``. The build
still "succeeds". The facts a build reports about itself are gathered by :mod:`torchkiln.verify.facts`
(standard library only, so the build's post-build check runs it in a clean venv too); this module
compares them with a recipe: every mismatch is a :class:`Check` that names the recipe field, the
expected and the actual value. The verification suite and ``torchkiln build``'s post-build check both
call :func:`recipe_checks` / :func:`torchvision_checks`: one comparison, not two copies.

Pure Python; nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

from torchkiln.recipe import libcompat
from torchkiln.recipe.archs import expected_arch_list
from torchkiln.recipe.compat import blas_kind, compat, vision_pairing, vision_pairs
from torchkiln.recipe.model import Recipe
from torchkiln.recipe.spelling import truth

from . import facts as _facts
from .facts import BuildFacts, TorchvisionFacts, decode_cudnn, dotted, parse_build_settings

__all__ = [
    "BuildFacts",
    "Check",
    "TorchvisionFacts",
    "collect_facts",
    "decode_cudnn",
    "dotted",
    "flag",
    "parse_build_settings",
    "recipe_checks",
    "self_checks",
    "torchvision_checks",
]


def collect_facts() -> BuildFacts:
    """The importable torch's facts (:func:`torchkiln.verify.facts.collect_facts`, standard library only)
    and what its ELF files say about NCCL and MAGMA (:mod:`torchkiln.verify.linkage`, with pyelftools)."""
    from . import linkage  # pyelftools: imported when the suite asks, not by the build's post-build check

    found = _facts.collect_facts()
    index = linkage.installed()
    torch_dist = index.get("torch")
    if torch_dist is None:  # a torch not installed as a distribution (a source tree on sys.path)
        return found
    linked = linkage.check_distribution(torch_dist, index, linkage.System.of_this_machine())
    return dataclasses.replace(found, **linkage.library_facts(torch_dist, linked))  # type: ignore[arg-type]


def flag(value: str | None) -> bool | None:
    """Normalise a build-settings boolean (``ON``/``1``/``True``/``OFF``/``0``...); None when absent."""
    if value is None:
        return None
    found = truth(value)
    if found is None:
        raise ValueError(f"{value!r} is not a boolean build setting (ON/OFF/1/0/TRUE/FALSE)")
    return found


@dataclass(frozen=True)
class Check:
    """One comparison. ``status`` is "pass", "fail" or "skip"; ``message`` says why. ``field`` is the
    recipe field a recipe check compares with (empty for checks of the build against itself), and
    leads every failure message, so a mismatch names what to look at in the recipe."""

    id: str
    status: str
    message: str
    expected: Any = None
    actual: Any = None
    field: str = ""


def _cmp(
    check_id: str, what: str, expected: Any, actual: Any, ok: bool | None = None, *, field: str = ""
) -> Check:
    ok = (expected == actual) if ok is None else ok
    prefix = f"{field}: " if field else ""
    if ok:
        return Check(check_id, "pass", f"{prefix}{what}: {actual}", expected, actual, field)
    return Check(
        check_id, "fail", f"{prefix}{what}: expected {expected}, actual {actual}", expected, actual, field
    )


def _skip(check_id: str, reason: str, *, field: str = "") -> Check:
    return Check(check_id, "skip", reason, field=field)


def _release(version: Version, parts: int) -> tuple[int, ...]:
    return tuple((version.release + (0,) * parts)[:parts])


def _version_or_none(text: str | None) -> Version | None:
    if text is None:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None


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
    "nccl_in_cuda_build",
    "magma_linked",
    "nvidia_packages",
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
    out["cxx11_abi"] = cxx11_abi_check(facts)
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
    out["nccl_in_cuda_build"] = nccl_check(facts)
    out["magma_linked"] = magma_check(facts)
    out["nvidia_packages"] = nvidia_packages_check(facts)
    out["wheel_tag"] = wheel_tag_check(facts)
    return out


# Upstream builds with the CXX11 ABI only from 2.7 on (pytorch#126551); 2.6 and older shipped pre-CXX11-ABI
# wheels to PyPI (upstream's 2.6.0+cu124 reports -D_GLIBCXX_USE_CXX11_ABI=0) and CXX11 ones elsewhere.
CXX11_ABI_ONLY_SINCE = Version("2.7")


def cxx11_abi_check(facts: BuildFacts) -> Check:
    """torch.compiled_with_cxx11_abi(): required from 2.7 on; before, either ABI is a release's build."""
    what = "torch.compiled_with_cxx11_abi() (CXX11 ABI only since 2.7)"
    if Version(Version(facts.torch_version).base_version) < CXX11_ABI_ONLY_SINCE:
        return Check(
            "cxx11_abi",
            "pass",
            f"{what}: {facts.cxx11_abi} (torch {facts.torch_version} predates 2.7: either ABI is upstream's)",
            None,
            facts.cxx11_abi,
        )
    return _cmp("cxx11_abi", what, True, facts.cxx11_abi)


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
    """The runtime cuDNN (``torch.backends.cudnn.version()``) can run what torch was compiled against
    (``torch._C._cudnn.getCompileVersion()``): cuDNN's own rule (:mod:`torchkiln.recipe.libcompat`: the same
    major, a minor at least the compiled one), which torch applies too. Upstream's 2.8.0 is compiled against
    9.8.0 and loads 9.10.2: compatible; a runtime older than the compiled one is not.

    Needs no GPU: ``torch.backends.cudnn.version()`` loads the library torch will use and reads its version.
    """
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
    compiled, runtime = dotted(facts.cudnn_compile), dotted(facts.cudnn_runtime)
    what = "runtime cuDNN (torch.backends.cudnn.version()) vs compiled cuDNN"
    if compiled is None or runtime is None:
        return _cmp("cudnn_runtime", what, compiled, runtime)
    problem = libcompat.cudnn_problem(Version(compiled), Version(runtime))
    return _cmp(
        "cudnn_runtime",
        f"{what} ({libcompat.CUDNN_RULE})" + (f": {problem}" if problem else ""),
        f"{compiled}, or a later {Version(compiled).major}.x",
        runtime,
        ok=problem is None,
    )


def nccl_check(facts: BuildFacts) -> Check:
    """A CUDA build whose Build settings say USE_NCCL=ON has NCCL: ``torch.cuda.nccl.version()`` answers
    (smoke_test.py prints it for every Linux CUDA build) and libtorch_cuda.so's libnccl resolves without
    LD_LIBRARY_PATH (or NCCL is linked in statically: no libnccl is NEEDED)."""
    if facts.cuda_version is None:
        return _skip("nccl_in_cuda_build", "not a CUDA build")
    claimed = facts.settings.get("USE_NCCL")
    if not flag(claimed):
        return _skip(
            "nccl_in_cuda_build", f"built without NCCL (Build settings USE_NCCL={claimed or '(absent)'})"
        )
    what = "USE_NCCL=ON in Build settings: torch.cuda.nccl.version()"
    if facts.nccl_version is None:
        said = (
            f"raised: {facts.nccl_error}"  # report.CAUSE_MARKERS: the cause, in torch's words
            if facts.nccl_error
            else f"gives no version: torch.distributed.is_nccl_available() is {facts.nccl_available}"
        )
        return Check("nccl_in_cuda_build", "fail", f"{what} {said}", "a version", None)
    version = dotted(facts.nccl_version)
    if not facts.libraries_read:
        return Check("nccl_in_cuda_build", "pass", f"{what} = {version} (torch's libraries were not read)")
    if facts.nccl_needed is None:
        return Check(
            "nccl_in_cuda_build", "pass", f"{what} = {version}, linked statically (no libnccl NEEDED)"
        )
    return _cmp(
        "nccl_in_cuda_build",
        f"{what} = {version}; libtorch_cuda.so needs {facts.nccl_needed}, resolved without LD_LIBRARY_PATH",
        "a path",
        facts.nccl_path or "not found",
        ok=facts.nccl_path is not None,
    )


def magma_check(facts: BuildFacts) -> Check:
    """``torch.cuda.has_magma`` (compiled in) agrees with the library that does CUDA linear algebra: MAGMA's
    symbols are in it (static, as upstream links it) or it needs a libmagma. check_binary.sh asks for
    has_magma only; this also catches the flag without the code (or the code without the flag)."""
    if facts.cuda_version is None:
        return _skip("magma_linked", "not a CUDA build")
    if not facts.libraries_read:
        return _skip(
            "magma_linked", "torch's libraries were not read (torch is not an installed distribution)"
        )
    return _cmp(
        "magma_linked",
        f"torch.cuda.has_magma={facts.has_magma} vs the MAGMA linked into torch's CUDA linear algebra",
        "MAGMA linked" if facts.has_magma else "no MAGMA",
        f"MAGMA {facts.magma_linkage}" if facts.magma_linkage else "no MAGMA symbols and no libmagma NEEDED",
        ok=facts.has_magma == (facts.magma_linkage is not None),
    )


def _package_problem(dist: str, version: str, loaded: str | None, compiled: str | None) -> str | None:
    """What is wrong with an installed ``nvidia-cudnn-cuXX``/``nvidia-nccl-cuXX`` (None: nothing): it must be
    the library torch loads (``loaded``, its first three parts) and one torch's compiled version may run with
    (:mod:`torchkiln.recipe.libcompat`); where the loaded one is not known, the compiled one exactly."""
    library = "cudnn" if "cudnn" in dist else "nccl"
    if loaded is None:
        if compiled is None or version == compiled or version.startswith(f"{compiled}."):
            return None
        return f"{dist} {version} (torch has {library} {compiled})"
    if not (version == loaded or version.startswith(f"{loaded}.")):
        return f"{dist} {version} is not the {library} torch loads ({loaded}: another copy shadows it)"
    if compiled is None:
        return None
    rule = libcompat.cudnn_problem if library == "cudnn" else libcompat.nccl_problem
    found = rule(Version(compiled), Version(version))
    return f"{dist} {version}: {found}" if found else None


def nvidia_packages_check(facts: BuildFacts) -> Check:
    """smoke_test.py --pypi-pkg-check: the installed ``nvidia-cudnn-cuXX`` / ``nvidia-nccl-cuXX``
    distributions are the libraries torch runs with (a stray wheel shadows them otherwise), and torch, as
    compiled, can run with them (cuDNN's and NCCL's rules: :mod:`torchkiln.recipe.libcompat`)."""
    if not facts.nvidia_dists:
        return _skip("nvidia_packages", "no nvidia-cudnn/nvidia-nccl PyPI packages are installed")
    compiled = {"cudnn": dotted(facts.cudnn_compile), "nccl": dotted(facts.nccl_version)}
    loaded = {"cudnn": dotted(facts.cudnn_runtime), "nccl": dotted(facts.nccl_runtime)}
    wrong, compared = [], []
    for dist, version in sorted(facts.nvidia_dists.items()):
        library = "cudnn" if "cudnn" in dist else "nccl"
        if compiled[library] is None and loaded[library] is None:
            continue
        shown = f"{dist}=={version}" + (
            f" (loaded {loaded[library]}, compiled {compiled[library]})"
            if loaded[library] and loaded[library] != compiled[library]
            else ""
        )
        compared.append(shown)
        problem = _package_problem(dist, version, loaded[library], compiled[library])
        if problem:
            wrong.append(problem)
    if not compared:
        return _skip("nvidia_packages", "torch reports no cuDNN/NCCL version to compare the packages with")
    if wrong:
        return Check(
            "nvidia_packages", "fail", "installed NVIDIA packages differ from torch's: " + "; ".join(wrong)
        )
    return Check("nvidia_packages", "pass", f"installed NVIDIA packages match torch: {', '.join(compared)}")


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
    "cudnn_runtime",
    "nccl",
    "nccl_runtime",
    "blas",
    "mkl_version",
    "magma",
    "arch_list",
    "git_commit",
    "flags",
    "python",
    "compiler",
    "platform",
)


def recipe_checks(recipe: Recipe, facts: BuildFacts, *, commit: str | None = None) -> dict[str, Check]:
    """Compare a build with its recipe. Keys are :data:`RECIPE_CHECKS`. ``commit``: the commit torch was
    built from (its checkout's HEAD, or a manifest's source), compared when the recipe pins none."""
    return {
        "torch_version": _torch_version_vs_recipe(recipe, facts),
        "local_label": _local_label_vs_recipe(recipe, facts),
        "build_type": _build_type_vs_recipe(recipe, facts),
        "use_cuda": _use_cuda_vs_recipe(recipe, facts),
        "cuda_version": _cuda_version_vs_recipe(recipe, facts),
        "cudnn": _cudnn_vs_recipe(recipe, facts),
        "cudnn_runtime": _cudnn_runtime_vs_recipe(recipe, facts),
        "nccl": _nccl_vs_recipe(recipe, facts),
        "nccl_runtime": _nccl_runtime_vs_recipe(recipe, facts),
        "blas": _blas_vs_recipe(recipe, facts),
        "mkl_version": _mkl_vs_recipe(recipe, facts),
        "magma": _magma_vs_recipe(recipe, facts),
        "arch_list": _arch_list_vs_recipe(recipe, facts),
        "git_commit": _commit_vs_recipe(recipe, facts, commit),
        "flags": _flags_vs_recipe(recipe.build.flags, facts.settings),
        "python": _python_vs_recipe(recipe, facts),
        "compiler": _compiler_vs_recipe(recipe, facts),
        "platform": _platform_vs_recipe(recipe, facts),
    }


def _torch_version_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Check:
    return _cmp(
        "torch_version",
        "torch version (torch.__version__ without local label)",
        Version(recipe.torch_wheel_version).public,
        Version(facts.torch_version).public,
        field="torch.version",
    )


def _local_label_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Check:
    actual = Version(facts.torch_version)
    wanted = Version(recipe.torch_wheel_version)
    return _cmp(
        "local_label",
        "torch local version label",
        f"+{wanted.local}" if wanted.local else "(none)",
        f"+{actual.local}" if actual.local else "(none)",
        field="build.pytorch_build_version" if recipe.build.pytorch_build_version else "build.local_version",
    )


def _build_type_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Check:
    s = facts.settings
    if "BUILD_TYPE" not in s:
        return Check(
            "build_type",
            "fail",
            "build.type: Build settings have no BUILD_TYPE",
            recipe.build.type,
            field="build.type",
        )
    return _cmp(
        "build_type", "Build settings BUILD_TYPE", recipe.build.type, s["BUILD_TYPE"], field="build.type"
    )


def _use_cuda_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Check:
    s, acc = facts.settings, recipe.accelerator
    use_cuda = bool(flag(s.get("USE_CUDA")))
    return _cmp(
        "use_cuda",
        "USE_CUDA (CUDA compiled in)",
        f"USE_CUDA=ON (recipe asks for CUDA {acc.cuda})" if acc.is_cuda else "USE_CUDA=OFF (CPU recipe)",
        f"USE_CUDA={s.get('USE_CUDA', '(absent)')}, torch.version.cuda={facts.cuda_version}",
        ok=use_cuda == acc.is_cuda and (facts.cuda_version is not None) == acc.is_cuda,
        field="accelerator.kind",
    )


def _cuda_version_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Check:
    acc = recipe.accelerator
    what = "CUDA version (torch.version.cuda)"
    if not (acc.is_cuda and acc.cuda is not None):
        return _cmp("cuda_version", what, None, facts.cuda_version, field="accelerator.cuda")
    got = _version_or_none(facts.cuda_version)
    return _cmp(
        "cuda_version",
        what,
        f"{acc.cuda}",
        facts.cuda_version,
        ok=got is not None and _release(got, 2) == _release(acc.cuda, 2),
        field="accelerator.cuda",
    )


def _blas_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Check:
    s = facts.settings
    if recipe.blas.kind == "mkl":
        return _cmp(
            "blas",
            "BLAS (Build settings BLAS_INFO, torch.backends.mkl.is_available())",
            "BLAS_INFO=mkl, MKL available",
            f"BLAS_INFO={s.get('BLAS_INFO')}, MKL available={facts.mkl_available}",
            ok=s.get("BLAS_INFO") == "mkl" and facts.mkl_available,
            field="blas.kind",
        )
    # OpenBLAS reports BLAS_INFO=open (cmake/Modules/FindBLAS.cmake), NVPL nvpl (compat.toml [blas.*]).
    kind = blas_kind(recipe.blas.kind)
    return _cmp(
        "blas",
        "BLAS (Build settings BLAS_INFO)",
        f"BLAS_INFO={kind['info']} ({kind['name']})",
        f"BLAS_INFO={s.get('BLAS_INFO')}",
        ok=s.get("BLAS_INFO", "").startswith(kind["info"]),
        field="blas.kind",
    )


def _magma_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Check:
    wanted = recipe.magma is not None
    return _cmp(
        "magma",
        "MAGMA (torch.cuda.has_magma)",
        f"{wanted} (recipe {'pins MAGMA ' + str(recipe.magma.version) if recipe.magma else 'has no [magma]'})",
        facts.has_magma,
        ok=facts.has_magma == wanted,
        field="magma",
    )


def _arch_list_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Check:
    acc = recipe.accelerator
    want_archs = expected_arch_list(acc.arch_list) if acc.is_cuda else set()
    got_archs = set(facts.arch_list)
    missing, extra = sorted(want_archs - got_archs), sorted(got_archs - want_archs)
    detail = f" (missing {missing}, unexpected {extra})" if missing or extra else ""
    return _cmp(
        "arch_list",
        f"{facts.arch_source} vs TORCH_CUDA_ARCH_LIST{detail}",
        sorted(want_archs),
        sorted(got_archs),
        ok=want_archs == got_archs,
        field="accelerator.arch_list",
    )


def _commit_vs_recipe(recipe: Recipe, facts: BuildFacts, commit: str | None) -> Check:
    if recipe.torch.commit or commit:
        return _pinned_commit("git_commit", "torch", recipe.torch.commit, commit, facts.git_version)
    return _cmp(
        "git_commit",
        "torch.version.git_version",
        "a commit, not 'Unknown'",
        facts.git_version,
        ok=facts.git_version not in (None, "", "Unknown"),
        field="torch.commit",
    )


def _python_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Check:
    """The interpreter against the recipe's Python, or any of its python.versions (a free-threaded "3.13t"
    runs as 3.13: facts.python_version is MAJOR.MINOR)."""
    field = "python.versions" if len(recipe.python_versions) > 1 else "python.version"
    if not facts.python_version:
        return _skip("python", "the Python version was not collected", field=field)
    wanted = " or ".join(recipe.python_versions)
    ok = facts.python_version in {p.removesuffix("t") for p in recipe.python_versions}
    return _cmp("python", "Python version running the build", wanted, facts.python_version, ok, field=field)


def _pinned_commit(
    check_id: str, project: str, pinned: str | None, built_from: str | None, actual: str | None
) -> Check:
    """``<project>.commit`` (or, where the recipe pins none, the commit the build's checkout was at) against
    the commit the build reports (``<project>.version.git_version``)."""
    source = "the recipe's pinned commit" if pinned else "the commit it was built from"
    what = f"{project}.version.git_version vs {source}"
    return _cmp(check_id, what, pinned or built_from, actual, field=f"{project}.commit")


def _cudnn_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Check:
    """accelerator.cudnn: the cuDNN torch is compiled against (``torch._C._cudnn.getCompileVersion()``,
    major.minor.patch: all torch records). The cuDNN it runs with is ``cudnn_runtime``'s check."""
    acc = recipe.accelerator
    what = "cuDNN compiled in (torch.backends.cudnn.is_available())"
    if not acc.is_cuda:
        return _cmp("cudnn", what, False, facts.cudnn_available, field="accelerator.cudnn")
    if acc.cudnn is None:
        return _cmp("cudnn", what, True, facts.cudnn_available, field="accelerator.cudnn")
    want = _release(acc.cudnn, 3)
    return _cmp(
        "cudnn",
        "cuDNN compile version (torch._C._cudnn.getCompileVersion())",
        dotted(want),
        dotted(facts.cudnn_compile),
        ok=facts.cudnn_compile == want,
        field="accelerator.cudnn",
    )


def _shipped(
    check_id: str, library: str, field: str, wanted: Version, dist: str, facts: BuildFacts, loaded: str | None
) -> Check:
    """The library the wheel runs with against the recipe: the full pin against the NVIDIA package torch
    runs with when one is installed (``9.10.2.21``: only the package says the fourth part), else against
    the version of the library torch loaded (major.minor.patch)."""
    installed = facts.nvidia_dists.get(dist)
    if installed is not None:
        return _cmp(
            check_id,
            f"{library} the wheel runs with (installed {dist})",
            str(wanted),
            installed,
            ok=Version(installed) == wanted,
            field=field,
        )
    want = dotted(_release(wanted, 3))
    return _cmp(check_id, f"{library} the wheel runs with (the loaded library)", want, loaded, field=field)


def _cudnn_runtime_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Check:
    """accelerator.cudnn_runtime (else accelerator.cudnn: the same cuDNN compiled and shipped) against the
    cuDNN the installed wheel runs with."""
    acc = recipe.accelerator
    field = "accelerator.cudnn_runtime" if acc.cudnn_runtime is not None else "accelerator.cudnn"
    wanted = acc.cudnn_shipped
    if not acc.is_cuda or wanted is None:
        what = "cuDNN the wheel runs with (torch.backends.cudnn.version())"
        expected = None if not acc.is_cuda else "a version"
        ok = (facts.cudnn_runtime is None) if not acc.is_cuda else facts.cudnn_runtime is not None
        return _cmp("cudnn_runtime", what, expected, dotted(facts.cudnn_runtime), ok=ok, field=field)
    dist = f"nvidia-cudnn-cu{acc.cuda.major}" if acc.cuda is not None else ""
    return _shipped("cudnn_runtime", "cuDNN", field, wanted, dist, facts, dotted(facts.cudnn_runtime))


def _nccl_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Check:
    acc, flags = recipe.accelerator, recipe.build.flags
    wanted = acc.is_cuda and flags.get("USE_NCCL", "1") != "0" and flags.get("USE_DISTRIBUTED", "1") != "0"
    if not wanted or acc.nccl is None:
        return _cmp(
            "nccl",
            "NCCL available (torch.distributed.is_nccl_available())",
            wanted,
            facts.nccl_available,
            field="accelerator.nccl",
        )
    want = _release(acc.nccl, 3)
    return _cmp(
        "nccl",
        "NCCL version (torch.cuda.nccl.version())",
        dotted(want),
        dotted(facts.nccl_version),
        ok=facts.nccl_available and facts.nccl_version == want,
        field="accelerator.nccl",
    )


def _nccl_runtime_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Check:
    """accelerator.nccl_runtime (else accelerator.nccl) against the NCCL the installed wheel runs with: the
    nvidia-nccl-cuXX package, else the libnccl torch loaded (``ncclGetVersion``), else -- no libnccl loaded:
    NCCL linked in statically -- the compiled one (``torch.cuda.nccl.version()``)."""
    acc, flags = recipe.accelerator, recipe.build.flags
    field = "accelerator.nccl_runtime" if acc.nccl_runtime is not None else "accelerator.nccl"
    wanted = acc.nccl_shipped
    used = acc.is_cuda and flags.get("USE_NCCL", "1") != "0" and flags.get("USE_DISTRIBUTED", "1") != "0"
    loaded = dotted(facts.nccl_runtime or facts.nccl_version)
    if not used or wanted is None:
        ok = loaded is None if not used else loaded is not None
        expected = "no NCCL" if not used else "an NCCL"
        return _cmp("nccl_runtime", "NCCL the wheel runs with", expected, loaded, ok=ok, field=field)
    dist = f"nvidia-nccl-cu{acc.cuda.major}" if acc.cuda is not None else ""
    return _shipped("nccl_runtime", "NCCL", field, wanted, dist, facts, loaded)


def _mkl_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Check:
    """blas.mkl vs the MKL version torch.__config__.show() reports ("... Library Version 2024.2-Product
    Build ..."): MAJOR.MINOR, which is all torch prints."""
    if recipe.blas.kind != "mkl" or recipe.blas.mkl is None:
        return _skip("mkl_version", f"the recipe builds with {recipe.blas.kind}, not MKL", field="blas.mkl")
    want = ".".join(str(p) for p in _release(recipe.blas.mkl, 2))
    got = _version_or_none(facts.mkl_version)
    return _cmp(
        "mkl_version",
        "MKL version (torch.__config__.show())",
        want,
        facts.mkl_version,
        ok=got is not None and _release(got, 2) == _release(recipe.blas.mkl, 2),
        field="blas.mkl",
    )


def _compiler_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Check:
    """build.gcc vs the compiler torch.__config__.show() names ("GCC 13.3"): the major version."""
    if recipe.build.gcc is None:
        return _skip("compiler", "the recipe does not pin a gcc (build.gcc)", field="build.gcc")
    got = facts.compiler or "(not reported)"
    family, _, version = got.partition(" ")
    return _cmp(
        "compiler",
        "host compiler (torch.__config__.show())",
        f"GCC {recipe.build.gcc}.x",
        got,
        ok=family == "GCC" and version.split(".")[0] == str(recipe.build.gcc),
        field="build.gcc",
    )


def _platform_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Check:
    """build.platform vs the machine torch was imported on (platform.machine()): its shared objects loaded
    here, so they are this machine's. An x86_64 recipe for an aarch64 build, or the other way, fails by name
    (compat.toml [platform.*] machines: aarch64 is also spelt arm64)."""
    machines = compat()["platform"][recipe.build.platform]["machines"]
    return _cmp(
        "platform",
        "machine torch runs on (platform.machine())",
        recipe.build.platform,
        facts.machine or "(not reported)",
        ok=facts.machine in machines,
        field="build.platform",
    )


def _flags_vs_recipe(flags: Mapping[str, str], settings: Mapping[str, str]) -> Check:
    """Recipe build flags that PyTorch reports in Build settings (USE_MKLDNN, USE_CUDNN, ...) must match."""
    compared, wrong = [], []
    for key, value in sorted(flags.items()):
        if key not in settings:
            continue  # not every build flag is reported (USE_DISTRIBUTED, BUILD_TEST, ...)
        want: bool | str | None
        got: bool | str | None
        try:
            want, got = flag(value), flag(settings[key])
        except ValueError:
            want, got = value, settings[key]
        compared.append(key)
        if want != got:
            wrong.append(f"{key}: expected {value}, actual {settings[key]}")
    if not compared:
        return _skip(
            "flags", "none of the recipe's build flags appear in Build settings", field="build.flags"
        )
    if wrong:
        return Check(
            "flags", "fail", "build.flags: differ from the build: " + "; ".join(wrong), field="build.flags"
        )
    return Check("flags", "pass", f"build flags match the recipe: {', '.join(compared)}", field="build.flags")


# --------------------------------------------------------------------------------------------------
# torchvision: it pairs with this torch, is the recipe's, and its compiled parts loaded.
# --------------------------------------------------------------------------------------------------

TORCHVISION_CHECKS = ("pairs_torch", "version", "commit", "cuda", "ops", "features")
VISION_PARTS = ("png", "jpeg", "webp", "nvjpeg", "video_codec", "ffmpeg")  # VisionFeatures.NAMES


def expected_parts(recipe: Recipe | None, cuda: bool) -> dict[str, bool]:
    """The optional parts torchvision must have: the recipe's ``[torchvision.features]``; without a recipe,
    what upstream's wheels have (PNG, JPEG and WebP always, nvJPEG in CUDA builds, no video decoder)."""
    if recipe is not None:
        return {part: bool(getattr(recipe.vision, part)) for part in VISION_PARTS}
    return {part: part in ("png", "jpeg", "webp") or (part == "nvjpeg" and cuda) for part in VISION_PARTS}


def _said(built: bool | None) -> str:
    return {True: "built with it", False: "built without it", None: "could not tell"}[built]


def _parts_vs_recipe(recipe: Recipe | None, facts: BuildFacts, tv: TorchvisionFacts) -> Check:
    """[torchvision.features] against what the installed torchvision was built with (each codec used once,
    :func:`torchkiln.verify.facts.probe_parts`): a part asked for and left out, or built in unasked."""
    field = "torchvision.features" if recipe is not None else ""
    if not tv.parts:
        return _skip("features", "these facts do not say which parts torchvision has", field=field)
    want = expected_parts(recipe, facts.cuda_version is not None)
    wrong = []
    for part, wanted in want.items():
        built = tv.parts.get(part)
        if built is not wanted:
            note = tv.part_notes.get(part)
            wrong.append(
                f"torchvision.features.{part}: expected {'true' if wanted else 'false'}, "
                f"{_said(built)}" + (f" ({note})" if note else "")
            )
    expected = ", ".join(p for p, w in want.items() if w) or "none"
    actual = ", ".join(p for p in want if tv.parts.get(p)) or "none"
    if wrong:
        return Check("features", "fail", "; ".join(wrong), expected, actual, field)
    return Check("features", "pass", f"torchvision's optional parts: {actual}", expected, actual, field)


def expected_torchvision(torch_version: Version) -> dict[str, Any]:
    """The torchvision that pairs with this torch: compat.toml's row (``torchvision``, ``torchvision_min``),
    else upstream's 0.(N+15) rule for a release it has no row for."""
    entry = compat().get("torch", {}).get(f"{torch_version.major}.{torch_version.minor}")
    if entry and "torchvision" in entry:
        return dict(entry)
    return {"torchvision": f"0.{torch_version.minor + 15}"}


def torchvision_checks(
    recipe: Recipe | None, facts: BuildFacts, *, commit: str | None = None
) -> dict[str, Check]:
    """torchvision against this torch (and the recipe, when given). Keys are :data:`TORCHVISION_CHECKS`;
    all skip when torchvision is not installed (whether it must be is the caller's decision). ``commit``:
    the commit torchvision was built from, compared when the recipe pins none."""
    tv = facts.torchvision
    if tv is None or tv.version is None:
        reason = tv.error if tv is not None and tv.error else "torchvision is not installed"
        status = "fail" if tv is not None and tv.error else "skip"
        return {c: Check(c, status, reason) for c in TORCHVISION_CHECKS}
    out: dict[str, Check] = {}
    torch_v, tv_v = Version(facts.torch_version), Version(tv.version)
    row = expected_torchvision(torch_v)
    pairs, wanted = vision_pairs(row, tv_v), vision_pairing(row)
    out["pairs_torch"] = Check(
        "pairs_torch",
        "pass" if pairs else "fail",
        f"torchvision {tv_v} pairs with torch {torch_v}"
        if pairs
        else f"torchvision {tv_v} does not pair with torch {torch_v}: expected torchvision {wanted}",
        wanted,
        str(tv_v),
        "torchvision.version" if recipe is not None else "",
    )
    if recipe is None:
        out["version"] = _skip("version", "no recipe: nothing to compare torchvision's version with")
        out["commit"] = _skip("commit", "no recipe: nothing to compare torchvision's commit with")
    else:
        out["version"] = _cmp(
            "version",
            "torchvision version (torchvision.__version__)",
            str(Version(recipe.torchvision_wheel_version)),
            str(tv_v),
            field="torchvision.version",
        )
        if recipe.torchvision.commit or commit:
            out["commit"] = _pinned_commit(
                "commit", "torchvision", recipe.torchvision.commit, commit, tv.git_version
            )
        else:
            out["commit"] = _skip(
                "commit", "the recipe pins no torchvision commit", field="torchvision.commit"
            )
    # torchvision reports CUDA as an int (13000); torch as a string ('13.0'): compared as major.minor.
    out["cuda"] = _cmp(
        "cuda",
        f"torchvision's CUDA (torchvision.version.cuda = {tv.cuda_raw!r}) vs torch.version.cuda",
        facts.cuda_version,
        tv.cuda,
    )
    if tv.error:
        out["ops"] = Check("ops", "fail", f"torchvision's C++ ops: {tv.error}")
    else:
        out["ops"] = _cmp(
            "ops",
            f"torchvision's C++ ops loaded (torchvision.extension._has_ops(); ships {', '.join(tv.extensions) or 'no .so'})",
            True,
            tv.has_ops,
        )
    out["features"] = _parts_vs_recipe(recipe, facts, tv)
    return out


def postbuild_checks(
    recipe: Recipe,
    facts: BuildFacts,
    projects: tuple[str, ...],
    *,
    commits: Mapping[str, str] | None = None,
) -> dict[str, Check]:
    """What ``torchkiln build``'s post-build check compares: the recipe checks of each project it built
    (``torch.<id>``, ``torchvision.<id>``), the same functions the verification suite runs. ``commits``:
    project -> the commit its checkout was at (compared where the recipe pins none)."""
    commits = commits or {}
    results: dict[str, Check] = {}
    if "torch" in projects:
        checks = recipe_checks(recipe, facts, commit=commits.get("torch"))
        results.update({f"torch.{k}": c for k, c in checks.items()})
    if "torchvision" in projects:
        checks = torchvision_checks(recipe, facts, commit=commits.get("torchvision"))
        results.update({f"torchvision.{k}": c for k, c in checks.items()})
    return results
