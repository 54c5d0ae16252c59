"""The toolchain a compile step really used: each tool as the build resolves it, at the version it reports.

Recorded when a compile step runs (with the environment it runs with) and kept with the step's state, so
the manifest of a later run that compiled nothing still names the tools that built its wheels. What is
recorded, and why it is true:

* the C and C++ compilers the build invokes: ``$CC``/``$CXX`` when set, else ``cc``/``c++`` (what CMake
  and ``torch.utils.cpp_extension`` use), found on the step's PATH; gcc's version from
  ``-dumpfullversion`` (``12.2.0``: the compiler's, not the distribution package's ``12.2.0-14``);
* ``cmake`` and ``ninja`` on the step's PATH (the build venv's first);
* ``nvcc`` for CUDA recipes only (``$CUDACXX``, the toolkit the plan names); the compiler cache's tool only
  when the build used one;
* ``git``, recorded by the build when it read a git checkout;
* cuDNN from ``cudnn_version.h`` under ``CUDA_HOME`` (CUDA recipes), the build venv's Python and packages.

A tool that is not there is left out; one that does not say its version is recorded with the error.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from torchkiln.process import runner

PROBE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Probe:
    """How a tool says its version: the arguments, and a regex whose first group is the version."""

    args: tuple[str, ...]
    pattern: str


PROBES: dict[str, Probe] = {
    "gcc": Probe(("-dumpfullversion",), r"^(\d+(?:\.\d+)+)\s*$"),
    "g++": Probe(("-dumpfullversion",), r"^(\d+(?:\.\d+)+)\s*$"),
    "clang": Probe(("-dumpversion",), r"^(\d+(?:\.\d+)+)\s*$"),
    "clang++": Probe(("-dumpversion",), r"^(\d+(?:\.\d+)+)\s*$"),
    "nvcc": Probe(("--version",), r"\bV(\d+\.\d+\.\d+)"),  # "Cuda compilation tools, release 13.0, V13.0.48"
    "cmake": Probe(("--version",), r"^cmake version (\S+)"),
    "ninja": Probe(("--version",), r"^(\d+(?:\.\d+)+\S*)\s*$"),
    "git": Probe(("--version",), r"^git version (\S+)"),
    "ccache": Probe(("--version",), r"^ccache version (\S+)"),
    "sccache": Probe(("--version",), r"^sccache (\S+)"),
}
# Packages of the build venv the manifest records.
BUILD_PACKAGES = (
    "setuptools",
    "wheel",
    "build",
    "numpy",
    "cmake",
    "ninja",
    "mkl-static",
    "mkl-include",
    "torch",
)


@dataclass(frozen=True)
class Tool:
    path: str  # the executable, as found
    version: str | None  # None: it did not say (see error)
    command: str  # what the build invokes ("c++", "$CXX=g++-13", "cmake")
    error: str | None = None


@dataclass(frozen=True)
class Toolchain:
    python: str | None = None
    tools: dict[str, Tool] = field(default_factory=dict)
    compilers: dict[str, str] = field(default_factory=dict)  # CC/CXX/CUDACXX/CUDAHOSTCXX when set
    cudnn: str | None = None
    mkl: str | None = None
    build_packages: dict[str, str] = field(default_factory=dict)


def probe(name: str, path: str, env: Mapping[str, str], command: str) -> Tool:
    """The version ``path`` reports, read as :data:`PROBES` says for ``name``."""
    spec = PROBES[name]
    try:
        done = runner.run([path, *spec.args], env=env, timeout=PROBE_TIMEOUT_S)
    except runner.ProcessError as exc:
        return Tool(path, None, command, str(exc))
    if not done.ok:
        return Tool(path, None, command, done.failure())
    for line in done.output.splitlines():
        match = re.search(spec.pattern, line.strip())
        if match:
            return Tool(path, match.group(1), command, None)
    return Tool(path, None, command, f"no version in the output of {path} {' '.join(spec.args)}")


def tool_version(name: str, env: Mapping[str, str]) -> Tool | None:
    """``name`` found on env's PATH and probed; None when it is not there."""
    path = shutil.which(name, path=env.get("PATH", os.defpath))
    return probe(name, path, env, name) if path else None


def compiler(variable: str, default: str, env: Mapping[str, str]) -> tuple[str, Tool] | None:
    """The compiler the build invokes for ``variable`` (CC or CXX): (name, tool), e.g. ("g++", ...).

    The family decides the name and how to ask for the version: gcc reports ``Free Software Foundation``,
    clang its own name, in ``--version``."""
    command = env.get(variable) or default
    executable = command.split()[0]
    path = shutil.which(executable, path=env.get("PATH", os.defpath))
    if path is None:
        return None
    shown = f"${variable}={command}" if env.get(variable) else command
    try:
        about = runner.run([path, "--version"], env=env, timeout=PROBE_TIMEOUT_S).output
    except runner.ProcessError as exc:
        return executable, Tool(path, None, shown, str(exc))
    cxx = variable == "CXX"
    if "clang" in about:
        name = "clang++" if cxx else "clang"
    elif "Free Software Foundation" in about:
        name = "g++" if cxx else "gcc"
    else:
        return executable, Tool(path, None, shown, "neither gcc nor clang (--version)")
    return name, probe(name, path, env, shown)


def cudnn_version(cuda_home: str | None) -> str | None:
    """cuDNN's version from its header (CUDNN_MAJOR/MINOR/PATCHLEVEL), None without CUDA or cuDNN."""
    if not cuda_home:
        return None
    for header in (Path(cuda_home) / "include" / "cudnn_version.h", Path("/usr/include/cudnn_version.h")):
        try:
            text = header.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        parts = [re.search(rf"#define CUDNN_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCHLEVEL")]
        if all(parts):
            return ".".join(p.group(1) for p in parts if p)
    return None


_PACKAGES_PROBE = (
    "import importlib.metadata as m, json, sys\n"
    "out = {}\n"
    "for n in sys.argv[1:]:\n"
    "    try: out[n] = m.version(n)\n"
    "    except m.PackageNotFoundError: pass\n"
    "out['python'] = '.'.join(map(str, sys.version_info[:3]))\n"
    "print(json.dumps(out))\n"
)


def python_packages(python: Path, names: tuple[str, ...]) -> dict[str, str]:
    """Installed versions of ``names`` in the interpreter ``python`` (the build venv), and its version."""
    if not python.exists():
        return {}
    done = runner.run([str(python), "-c", _PACKAGES_PROBE, *names], timeout=60)
    lines = done.stdout.strip().splitlines()
    if not done.ok or not lines:
        return {}
    try:
        found = json.loads(lines[-1])
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def collect(env: Mapping[str, str], venv_python: Path, *, cuda: bool, cache_tool: str | None) -> Toolchain:
    """What a compile step running with ``env`` uses (see the module docstring)."""
    tools: dict[str, Tool] = {}
    for variable, default in (("CC", "cc"), ("CXX", "c++")):
        found = compiler(variable, default, env)
        if found is not None:
            tools[found[0]] = found[1]
    wanted = ["cmake", "ninja", *([cache_tool] if cache_tool else [])]
    for name in wanted:
        tool = tool_version(name, env)
        if tool is not None:
            tools[name] = tool
    if cuda:
        nvcc = env.get("CUDACXX") or str(Path(env.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc")
        if Path(nvcc).is_file():
            tools["nvcc"] = probe("nvcc", nvcc, env, "$CUDACXX" if env.get("CUDACXX") else nvcc)
    packages = python_packages(venv_python, BUILD_PACKAGES)
    return Toolchain(
        python=packages.pop("python", None),
        tools=tools,
        compilers={k: env[k] for k in ("CC", "CXX", "CUDAHOSTCXX", "CUDACXX") if env.get(k)},
        cudnn=cudnn_version(env.get("CUDA_HOME")) if cuda else None,
        mkl=packages.get("mkl-static"),
        build_packages=packages,
    )
