"""Build-config checks of cuDNN and NCCL: the version torch was compiled against, the library it loads and
whether it may run with it (:mod:`torchkiln.recipe.libcompat`), the ``nvidia-cudnn-cuXX``/``nvidia-nccl-cuXX``
packages it runs with, and each against the recipe's ``accelerator`` pins."""

from __future__ import annotations

from packaging.version import Version

from torchkiln.recipe import libcompat
from torchkiln.recipe.model import Recipe

from .comparison import Comparison, _cmp, _release, _skip, flag
from .facts import BuildFacts, dotted


def cudnn_runtime_check(facts: BuildFacts) -> Comparison:
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
        return Comparison(
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


def nccl_check(facts: BuildFacts) -> Comparison:
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
        return Comparison("nccl_in_cuda_build", "fail", f"{what} {said}", "a version", None)
    version = dotted(facts.nccl_version)
    if not facts.libraries_read:
        return Comparison(
            "nccl_in_cuda_build", "pass", f"{what} = {version} (torch's libraries were not read)"
        )
    if facts.nccl_needed is None:
        return Comparison(
            "nccl_in_cuda_build", "pass", f"{what} = {version}, linked statically (no libnccl NEEDED)"
        )
    return _cmp(
        "nccl_in_cuda_build",
        f"{what} = {version}; libtorch_cuda.so needs {facts.nccl_needed}, resolved without LD_LIBRARY_PATH",
        "a path",
        facts.nccl_path or "not found",
        ok=facts.nccl_path is not None,
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


def nvidia_packages_check(facts: BuildFacts) -> Comparison:
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
        return Comparison(
            "nvidia_packages", "fail", "installed NVIDIA packages differ from torch's: " + "; ".join(wrong)
        )
    return Comparison(
        "nvidia_packages", "pass", f"installed NVIDIA packages match torch: {', '.join(compared)}"
    )


def _cudnn_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Comparison:
    """accelerator.cudnn: the cuDNN torch is compiled against (``torch._C._cudnn.getCompileVersion()``,
    major.minor.patch: all torch records). The cuDNN it runs with is ``cudnn_runtime``'s check."""
    acc = recipe.accelerator
    if not acc.is_cuda or acc.cudnn is None:
        what = "cuDNN compiled in (torch.backends.cudnn.is_available())"
        return _cmp("cudnn", what, acc.is_cuda, facts.cudnn_available, field="accelerator.cudnn")
    what = "cuDNN compile version (torch._C._cudnn.getCompileVersion())"
    return _compiled_against("cudnn", what, acc.cudnn, facts.cudnn_compile, field="accelerator.cudnn")


def _compiled_against(
    check_id: str,
    what: str,
    pinned: Version,
    found: tuple[int, ...] | None,
    *,
    field: str,
    usable: bool = True,
) -> Comparison:
    """The version of a library torch was compiled against (``found``) against the recipe's pin, to
    major.minor.patch (all torch records)."""
    want = _release(pinned, 3)
    return _cmp(check_id, what, dotted(want), dotted(found), ok=usable and found == want, field=field)


def _shipped(
    check_id: str, library: str, field: str, wanted: Version, dist: str, facts: BuildFacts, loaded: str | None
) -> Comparison:
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


def _cudnn_runtime_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Comparison:
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


def _nccl_built(recipe: Recipe) -> bool:
    """Whether the recipe builds NCCL in: a CUDA build whose flags turn off neither NCCL nor distributed."""
    flags = recipe.build.flags
    return (
        recipe.accelerator.is_cuda
        and flags.get("USE_NCCL", "1") != "0"
        and flags.get("USE_DISTRIBUTED", "1") != "0"
    )


def _nccl_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Comparison:
    acc, wanted = recipe.accelerator, _nccl_built(recipe)
    if not wanted or acc.nccl is None:
        what = "NCCL available (torch.distributed.is_nccl_available())"
        return _cmp("nccl", what, wanted, facts.nccl_available, field="accelerator.nccl")
    what = "NCCL version (torch.cuda.nccl.version())"
    return _compiled_against(
        "nccl", what, acc.nccl, facts.nccl_version, field="accelerator.nccl", usable=facts.nccl_available
    )


def _nccl_runtime_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Comparison:
    """accelerator.nccl_runtime (else accelerator.nccl) against the NCCL the installed wheel runs with: the
    nvidia-nccl-cuXX package, else the libnccl torch loaded (``ncclGetVersion``), else -- no libnccl loaded:
    NCCL linked in statically -- the compiled one (``torch.cuda.nccl.version()``)."""
    acc = recipe.accelerator
    field = "accelerator.nccl_runtime" if acc.nccl_runtime is not None else "accelerator.nccl"
    wanted = acc.nccl_shipped
    used = _nccl_built(recipe)
    loaded = dotted(facts.nccl_runtime or facts.nccl_version)
    if not used or wanted is None:
        ok = loaded is None if not used else loaded is not None
        expected = "no NCCL" if not used else "an NCCL"
        return _cmp("nccl_runtime", "NCCL the wheel runs with", expected, loaded, ok=ok, field=field)
    dist = f"nvidia-nccl-cu{acc.cuda.major}" if acc.cuda is not None else ""
    return _shipped("nccl_runtime", "NCCL", field, wanted, dist, facts, loaded)
