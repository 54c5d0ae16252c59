"""The other side of ``torchkiln verify --compare-with REQ``: upstream's wheel in a venv of its own.

``REQ`` is what pip installs: a requirement (``torch===2.13.0`` for upstream's CUDA build, ``torch==2.13.0``
where the index has a CPU build) or a wheel file. The venv is made from the interpreter under test (same
Python, so the same wheel tag and the same ``random`` for the battery's inputs), once per (REQ, Python
installation: every venv of one installation shares it), and kept in ``$TORCHKILN_COMPARE_CACHE`` (default
``~/.cache/torchkiln/compare``): upstream's CUDA wheels and their nvidia-* dependencies are gigabytes. It is
built under a temporary name and renamed into place when torch imports in it, so an interrupted install is
never reused.

The battery (:mod:`torchkiln.verify.battery`) runs there with ``python -I``: neither ``PYTHONPATH`` nor the
user's site-packages can put the torch under test on its path.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from torchkiln.errors import TorchkilnError, UsageError
from torchkiln.files.digests import file_sha256

from . import battery, proc

CACHE_ENV = "TORCHKILN_COMPARE_CACHE"
MARKER = "torchkiln-compare.json"
INSTALL_TIMEOUT = 3600.0  # a CUDA wheel with its dependencies: several GB from the index
BATTERY_TIMEOUT = 600.0


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "torchkiln" / "compare")


# What makes two interpreters the same for the reference venv: ``python -m venv`` run by a venv's interpreter
# makes a venv of that venv's base installation (``sys.base_prefix``), with none of its packages, so every
# venv of one Python installation shares one reference venv (the tests' and each nox session's, a user's
# several venvs), rather than a copy of upstream's CUDA wheels (gigabytes) per venv.
_IDENTITY = "import os, sys; print(os.path.realpath(sys.base_prefix)); print(sys.version)"


def _key(requirement: str, python: str) -> str:
    """The cache entry of (REQ, Python installation): a wheel file by its content, a requirement by its text;
    the installation by its base prefix and version."""
    wheel = Path(requirement)
    what = f"wheel:{file_sha256(wheel)}" if requirement.endswith(".whl") and wheel.is_file() else requirement
    identity = proc.run([python, "-I", "-c", _IDENTITY], timeout=60).stdout.strip()
    return hashlib.sha256(f"{what}\n{identity}".encode()).hexdigest()[:24]


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _torch_version(python: Path) -> str | None:
    done = proc.run([str(python), "-I", "-c", "import torch; print(torch.__version__)"], timeout=300)
    return done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else None


def check_requirement(requirement: str) -> None:
    """A ``--compare-with`` that names a wheel file names one that exists (a usage error before anything
    runs, torch or not)."""
    if requirement.endswith(".whl") and not Path(requirement).is_file():
        raise UsageError(f"--compare-with {requirement}: no such wheel file (valid: a requirement or a .whl)")


def reference_python(requirement: str, *, python: str = sys.executable) -> Path:
    """The interpreter of a venv holding ``requirement``: the cached one, or a new one (see the module
    docstring). A requirement pip cannot install is a usage error naming it and pip's reason."""
    check_requirement(requirement)
    venv = cache_root() / _key(requirement, python)
    if (venv / MARKER).is_file() and _torch_version(_venv_python(venv)):
        return _venv_python(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(dir=venv.parent, prefix=f".{venv.name}."))
    try:
        _make(building, requirement, python)
        version = _torch_version(_venv_python(building))
        if version is None:
            raise UsageError(f"--compare-with {requirement}: installed, but torch does not import from it")
        (building / MARKER).write_text(json.dumps({"requirement": requirement, "torch": version}) + "\n")
        if venv.exists():
            shutil.rmtree(venv)
        os.replace(building, venv)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return _venv_python(venv)


def _make(venv: Path, requirement: str, python: str) -> None:
    made = proc.run([python, "-m", "venv", "--clear", str(venv)], timeout=300)
    if made.returncode != 0:
        raise TorchkilnError(f"--compare-with: cannot make a venv with {python}: {made.describe()}")
    argv = [str(_venv_python(venv)), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    installed = proc.run([*argv, requirement], timeout=INSTALL_TIMEOUT)
    if installed.returncode != 0:
        lines = [line for line in installed.stderr.splitlines() if line.strip() and "WARNING" not in line]
        reason = lines[-1].strip() if lines else f"pip exited {installed.returncode}"
        raise UsageError(f"--compare-with {requirement}: pip cannot install it: {reason}")


def run_battery(
    python: Path | str, out: Path, *, isolated: bool, environ: Mapping[str, str] | None = None
) -> None:
    """Run the battery with ``python`` into ``out``; ``isolated``: ``python -I`` (the reference side);
    ``environ``: what it runs under the suite's policy from (default: this process's)."""
    argv = [str(python), *(["-I"] if isolated else []), battery.__file__, "--out", str(out)]
    env = proc.worker_environment(os.environ if environ is None else environ)
    done = proc.run(argv, timeout=BATTERY_TIMEOUT, env=env)
    if done.returncode != 0 or not out.is_file():
        raise TorchkilnError(f"the parity battery failed with {python}: {done.describe()}")
