"""Preflight before a build without asking the host again what it answered before (issue 38).

:func:`torchkiln.plan.preflight.preflight` runs every check on every call: two compiles and links of a
trivial program, the recipe's Python started twice, ``$CC --version``: most of a no-op rebuild's time. This
module is a layer around those checks, not another set of them. A check in :data:`KEYS` has a key function
that names, cheaply (``stat``, ``which``, no process), everything its verdict depends on:

============== ===========================================================================================
python         each ``pythonX.Y`` of the recipe as PATH resolves it (the file's identity:
               :func:`~torchkiln.plan.records.file_identity`), its ``venv``/``ensurepip``/``sysconfig``
               modules where its prefix keeps them, the ``PYTHON*`` variables
python-headers the same interpreters and ``Python.h`` where their prefix keeps it
toolchain      the C and C++ compilers the build invokes (``$CC``/``$CXX`` of the plan, else the caller's, else
               ``cc``/``c++``: every word of the command that is a program), the variables a compiler driver
               reads (``CPATH``, ``LIBRARY_PATH``, ``GCC_EXEC_PREFIX``, ...), the trivial programs' text
compiler       the same compilers, the recipe's ``build.gcc``, torch release and CUDA version
nvcc           the plan's nvcc, its toolkit's ``targets/``, the recipe's CUDA version
git            ``git`` on PATH and the torch release's minimum (only when a source is fetched)
============== ===========================================================================================

plus, for every key, ``PATH``, ``LD_LIBRARY_PATH``, ``LD_PRELOAD``, ``TMPDIR`` and the identity of the code
that checks (this module, :mod:`~torchkiln.plan.preflight` and the modules of its checks). A check whose key
is unchanged since it last passed is not run again; a changed key runs it. Only passes are kept: a check that
found a problem runs again next time, whatever its key. A program that is a script (``#!``: a pyenv shim, a
wrapper) runs what its own identity does not say, so a check that invokes one is never kept. Every other check
(disk, memory, platform, the trees' versions and submodules, the torch wheel, torchvision's parts, the cache
tool, the headers of cuDNN, NCCL, MAGMA, BLAS) costs a ``stat`` or a read and runs every time: free disk is
asked afresh on every build.

What no key can see (a header removed from the compiler's search path, a library the linker no longer
finds) shows as a failed step; :func:`diagnose` then runs every check afresh, and the build's error says
what it found. ``torchkiln check`` never reads these records: it is the diagnosis, so it asks the host.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchkiln.recipe.compat import platform_data

from . import (
    preflight,
    preflight_findings,
    preflight_libraries,
    preflight_machine,
    preflight_python,
    preflight_sources,
    preflight_toolchain,
    source_adoption,
)
from .model import Plan
from .preflight_findings import Finding, Host, PreflightError
from .preflight_toolchain import COMPILERS
from .records import Records, file_identity

# Read by every probe that starts a process (what the process resolves and loads, where it writes).
COMMON_VARS = ("PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "TMPDIR")
# What gcc's and clang's drivers read, and the compiler caches a CC may name.
COMPILER_VARS = (
    "CPATH",
    "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH",
    "LIBRARY_PATH",
    "COMPILER_PATH",
    "CC",
    "CXX",
)
COMPILER_PREFIXES = ("GCC_", "CCACHE_", "SCCACHE_")

Key = dict[str, Any]


class Uncacheable(Exception):
    """The verdict depends on something no key can name (a script): the check runs every time."""


def _vars(environ: Mapping[str, str], names: tuple[str, ...], prefixes: tuple[str, ...] = ()) -> Key:
    return {k: v for k, v in sorted(environ.items()) if k in names or k.startswith(prefixes)}


def is_script(path: str) -> bool:
    """Whether ``path`` is a ``#!`` script (what it runs is not in its own file)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(2) == b"#!"
    except OSError:
        return False


def program(command: str, environ: Mapping[str, str]) -> Key:
    """Each word of ``command`` that is a program on ``environ``'s PATH (or a path), by identity; the other
    words as they are. Raises :class:`Uncacheable` for a script."""
    try:
        words = shlex.split(command)
    except ValueError:
        raise Uncacheable(command) from None
    found: Key = {"command": command}
    for word in words:
        path = shutil.which(word, path=environ.get("PATH", os.defpath))
        if path is None:
            continue
        if is_script(path):
            raise Uncacheable(path)
        found[word] = file_identity(path)
    return found


def _python(plan: Plan, host: Host, *, headers: bool) -> Key:
    """Each recipe Python: the interpreter, and the files of its prefix the probes read."""
    found: Key = {"vars": _vars(host.environ, (), ("PYTHON",))}
    for want in plan.recipe.python_versions:
        exe = f"python{want}"
        where = program(exe, host.environ)
        path = shutil.which(exe, path=host.environ.get("PATH", os.defpath))
        if path is not None:
            prefix = Path(os.path.realpath(path)).parent.parent
            lib = prefix / "lib" / f"python{want.rstrip('t')}"
            files = [lib / "venv" / "__init__.py", lib / "ensurepip" / "__init__.py", lib / "sysconfig.py"]
            if headers:
                files.append(prefix / "include" / f"python{want}" / "Python.h")
            where["files"] = {str(f): file_identity(f) for f in files}
        found[want] = where
    return found


def _compilers(plan: Plan, host: Host, checks: tuple[str, ...] = ("cxx", "cc")) -> Key:
    invoked = preflight_toolchain._compilers(plan, host)
    return {
        "programs": {name: program(invoked[name].command, host.environ) for name in checks},
        "vars": _vars(host.environ, COMPILER_VARS, COMPILER_PREFIXES),
    }


def _toolchain_key(plan: Plan, host: Host) -> Key:
    return {**_compilers(plan, host), "sources": [(c.check, c.source, c.suffix) for c in COMPILERS]}


def _compiler_key(plan: Plan, host: Host) -> Key:
    r = plan.recipe
    return {
        **_compilers(plan, host, ("cc",)),  # $CC (the plan's, else the caller's), else cc, else gcc
        "defaults": {name: program(name, host.environ) for name in ("cc", "gcc")},
        "recipe": [r.build.gcc, str(r.torch.version), str(r.accelerator.cuda)],
    }


def _nvcc_key(plan: Plan, host: Host) -> Key:
    r = plan.recipe
    if r.accelerator.cuda is None:
        return {"cuda": None}
    env = preflight_findings._env(plan)
    home = env.get("CUDA_HOME", "")
    nvcc = env.get("CUDACXX") or f"{home}/bin/nvcc"
    targets = Path(home, "targets")
    return {
        "cuda": str(r.accelerator.cuda),
        "nvcc": program(nvcc, host.environ),
        "targets": sorted(p.name for p in targets.iterdir()) if targets.is_dir() else None,
        "target": platform_data(r)["toolkit_target"],
    }


def _git_key(plan: Plan, host: Host) -> Key:
    if all(s.provided for s in plan.sources):
        return {"fetched": False}
    return {"git": program("git", host.environ), "torch": str(plan.recipe.torch.version)}


KEYS: dict[str, Callable[[Plan, Host], Key]] = {
    "python": lambda plan, host: _python(plan, host, headers=False),
    "python-headers": lambda plan, host: _python(plan, host, headers=True),
    "toolchain": _toolchain_key,
    "compiler": _compiler_key,
    "nvcc": _nvcc_key,
    "git": _git_key,
}


def _code() -> Key:
    """The code that checks: a changed check is a new question."""
    return {
        name: file_identity(path)
        for name, path in (
            ("preflight", preflight.__file__),
            ("findings", preflight_findings.__file__),
            ("python", preflight_python.__file__),
            ("toolchain", preflight_toolchain.__file__),
            ("libraries", preflight_libraries.__file__),
            ("machine", preflight_machine.__file__),
            ("sources", preflight_sources.__file__),
            ("adoption", source_adoption.__file__),
            ("keys", __file__),
        )
    }


def check_key(name: str, plan: Plan, host: Host) -> str | None:
    """The record key of check ``name`` for ``plan`` on ``host``; None when it is not kept."""
    make = KEYS.get(name)
    if make is None:
        return None
    try:
        parts = make(plan, host)
    except (Uncacheable, OSError):
        return None
    return Records.key(
        f"preflight-{name}", {"check": parts, "vars": _vars(host.environ, COMMON_VARS), "code": _code()}
    )


@dataclass(frozen=True)
class Outcome:
    """What preflight found, and which checks' passes were read back instead of run."""

    findings: list[Finding]
    remembered: tuple[str, ...] = ()


def remembered_preflight(
    plan: Plan, records: Records, environ: Mapping[str, str] | None = None, *, fresh: bool = False
) -> Outcome:
    """Every check of :data:`~torchkiln.plan.preflight.CHECKS`, each kept one read back when its key has a
    pass (never with ``fresh``). The failures' records are dropped; the passes are recorded when nothing
    failed (a refused build leaves nothing behind) or, with ``fresh``, always (a failed build's work
    directory)."""
    host = Host(dict(os.environ if environ is None else environ))
    findings: list[Finding] = []
    remembered: list[str] = []
    passed: list[tuple[str, str]] = []
    for name, check in preflight.CHECKS:
        key = check_key(name, plan, host)
        if key is not None and not fresh and records.get(key) is not None:
            remembered.append(name)
            continue
        found = list(check(plan, host))
        findings += found
        if key is not None:
            if found:
                records.drop(key)
            else:
                passed.append((name, key))
    if fresh or not findings:
        for name, key in passed:
            records.put(key, {"check": name, "passed": True})
    return Outcome(findings, tuple(remembered))


def require_remembered(plan: Plan, records: Records, environ: Mapping[str, str] | None = None) -> Outcome:
    """:func:`remembered_preflight`, raising :class:`PreflightError` with every problem."""
    outcome = remembered_preflight(plan, records, environ)
    if outcome.findings:
        raise PreflightError(outcome.findings)
    return outcome


def diagnose(plan: Plan, records: Records, environ: Mapping[str, str] | None = None) -> list[Finding]:
    """After a failed build: every check afresh (the records follow what they find)."""
    return remembered_preflight(plan, records, environ, fresh=True).findings
