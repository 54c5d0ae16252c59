"""``dist/manifest.json``: what was built, from what, with what, how long it took.

The toolchain versions are the ones *actually used*: each tool is looked up on the PATH of the build's
environment (the build venv's bin first, as the build saw it), not assumed from the recipe. cuDNN's version
comes from ``cudnn_version.h`` under CUDA_HOME, MKL's from the build venv's installed ``mkl-static``.
Secrets never reach the manifest: it is built from the plan's env (which holds none) and the stats.
"""

from __future__ import annotations

import datetime as dt
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import __version__

MANIFEST_FORMAT = 1
VERSION_RE = re.compile(r"(\d+\.\d+(?:\.\d+)?(?:[.-]?[A-Za-z0-9]+)*)")

# tool -> (argv after the executable, regex that must precede the version on the first matching line)
TOOLS: dict[str, tuple[tuple[str, ...], str]] = {
    "gcc": (("--version",), r"^gcc"),
    "g++": (("--version",), r"^g\+\+"),
    "cmake": (("--version",), r"^cmake version"),
    "ninja": (("--version",), r""),
    "nvcc": (("--version",), r"^Cuda compilation tools, release"),
    "ccache": (("--version",), r"^ccache version"),
    "sccache": (("--version",), r"^sccache"),
    "git": (("--version",), r"^git version"),
}


def tool_version(tool: str, env: Mapping[str, str]) -> dict[str, str] | None:
    """``{"path", "version"}`` of ``tool`` on env's PATH, None when it is not there."""
    path = shutil.which(tool, path=env.get("PATH"))
    if path is None:
        return None
    args, prefix = TOOLS[tool]
    try:
        done = subprocess.run(  # noqa: S603 - argv list, a resolved executable
            [path, *args], capture_output=True, text=True, timeout=30, env=dict(env), check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return {"path": path, "version": "unknown"}
    for line in (done.stdout + done.stderr).splitlines():
        if re.search(prefix, line):
            # nvcc: "Cuda compilation tools, release 13.0, V13.0.48" -> the V-number is the full version
            full = re.search(r"\bV(\d+\.\d+\.\d+)", line)
            match = full or VERSION_RE.search(
                line[len(re.match(prefix, line).group(0)) :] if prefix else line
            )
            if match:
                return {"path": path, "version": match.group(1)}
    return {"path": path, "version": "unknown"}


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


def python_packages(python: Path, names: tuple[str, ...]) -> dict[str, str]:
    """Installed versions of ``names`` in the interpreter ``python`` (the build venv)."""
    if not python.exists():
        return {}
    probe = (
        "import importlib.metadata as m, json, sys\n"
        "out = {}\n"
        "for n in sys.argv[1:]:\n"
        "    try: out[n] = m.version(n)\n"
        "    except m.PackageNotFoundError: pass\n"
        "out['python'] = '.'.join(map(str, sys.version_info[:3]))\n"
        "print(json.dumps(out))\n"
    )
    import json

    try:
        done = subprocess.run(  # noqa: S603 - argv list
            [str(python), "-c", probe, *names], capture_output=True, text=True, timeout=60, check=False
        )
        return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {}
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return {}


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


def toolchain(env: Mapping[str, str], venv_python: Path, cuda_home: str | None) -> dict[str, Any]:
    tools = {name: tool_version(name, env) for name in TOOLS}
    packages = python_packages(venv_python, BUILD_PACKAGES)
    return {
        "python": packages.pop("python", None),
        "tools": {k: v for k, v in tools.items() if v is not None},
        # an explicit compiler choice of the build env wins over gcc/g++ on PATH
        "compilers": {k: env[k] for k in ("CC", "CXX", "CUDAHOSTCXX", "CUDACXX") if env.get(k)},
        "cudnn": cudnn_version(cuda_home),
        "mkl": packages.get("mkl-static"),
        "build_packages": packages,
    }


def build_manifest(
    *,
    plan_dict: Mapping[str, Any],
    sources: Mapping[str, Any],
    toolchain_info: Mapping[str, Any],
    build_env: Mapping[str, Mapping[str, str]],
    steps: list[dict[str, Any]],
    cache: Mapping[str, Any] | None,
    wheels: list[dict[str, Any]],
    checks: Mapping[str, Any] | None,
    started: dt.datetime,
    finished: dt.datetime,
) -> dict[str, Any]:
    stages: dict[str, float] = {}
    for step in steps:
        # A wheel step's time is split into its phases: configure, compile, wheel.
        for stage, seconds in (step.get("phases") or {step["stage"]: step["duration_s"]}).items():
            stages[stage] = round(stages.get(stage, 0.0) + seconds, 3)
    return {
        "format": MANIFEST_FORMAT,
        "torchkiln": __version__,
        "started": started.isoformat(timespec="seconds"),
        "finished": finished.isoformat(timespec="seconds"),
        "recipe": dict(plan_dict["recipe"]),
        "projects": list(plan_dict["projects"]),
        "jobs": plan_dict["jobs"],
        "sources": dict(sources),
        "toolchain": dict(toolchain_info),
        "build_env": {k: dict(v) for k, v in build_env.items()},
        "stages": stages,
        "steps": steps,
        "cache": dict(cache) if cache is not None else None,
        "checks": dict(checks) if checks is not None else None,
        "wheels": wheels,
    }
