"""Preflight's checks of the recipe's Python: each ``pythonX.Y`` it builds for runs (with venv and ensurepip)
and has its C headers; the fix names where such a Python comes from on this host's distribution.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from torchkiln.host import distro as distros
from torchkiln.recipe.compat import compat, minor
from torchkiln.recipe.loader import recipes_dir

from .model import Plan
from .preflight_findings import Finding, Host, _devel_image, _run

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
