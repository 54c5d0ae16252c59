"""The toolchain a compile step used, probed once per toolchain rather than after every compile (issue 38).

:func:`torchkiln.host.toolchain.collect` starts about eight processes after every compile that ran: the C
and C++ compilers twice each, cmake and ninja (Python entry points of the build venv), the compiler cache,
the build venv's Python for its packages: about half a second around a cached compile of seconds. What they
report depends on the programs and on nothing else the step changes, so the answer is kept
(:mod:`torchkiln.plan.records`) under a key of:

* each program as the step's PATH resolves it (``$CC``/``$CXX`` else ``cc``/``c++``, ``cmake``, ``ninja``,
  the cache tool, ``$CUDACXX`` else ``$CUDA_HOME/bin/nvcc``), by its file's identity; a script inside the
  build venv (pip's entry points) by its identity and the venv's installed distributions (what it runs); any
  other script (a wrapper) makes the answer unkept: probed every time;
* the build venv's Python (its interpreter's identity) and installed distributions (the packages recorded);
* cuDNN's header, the variables that choose the programs (``PATH``, ``CC``, ``CXX``, ``CUDACXX``,
  ``CUDAHOSTCXX``, ``CUDA_HOME``, ``LD_LIBRARY_PATH``) and the probing code.

A changed key probes afresh; the answer recorded in the step's outputs is the probes' either way.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchkiln.artifacts import jsonfile
from torchkiln.errors import DocumentError
from torchkiln.host import toolchain
from torchkiln.host.toolchain import Toolchain, collect
from torchkiln.plan.preflight_records import Uncacheable, is_script
from torchkiln.plan.records import Records, file_identity

from .envstore import venv_distributions

VARIABLES = ("PATH", "CC", "CXX", "CUDACXX", "CUDAHOSTCXX", "CUDA_HOME", "LD_LIBRARY_PATH", "LD_PRELOAD")


def _program(command: str | None, environ: Mapping[str, str], venv: Path) -> Any:
    if not command:
        return None
    path = shutil.which(command.split()[0], path=environ.get("PATH", os.defpath))
    if path is None:
        return None
    if is_script(path):
        if not Path(path).absolute().is_relative_to(venv):
            raise Uncacheable(path)
        return "an entry point of the build venv"  # what it runs: the venv's distributions, in the key
    return file_identity(path)


def _key(
    environ: Mapping[str, str], venv_python: Path, workdir: Path, cuda: bool, cache_tool: str | None
) -> str | None:
    venv = venv_python.parent.parent.absolute()
    nvcc = environ.get("CUDACXX") or str(Path(environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc")
    commands = {
        "cc": environ.get("CC") or "cc",
        "cxx": environ.get("CXX") or "c++",
        "cmake": "cmake",
        "ninja": "ninja",
        "cache": cache_tool,
        "nvcc": nvcc if cuda else None,
    }
    try:
        programs = {name: _program(command, environ, venv) for name, command in commands.items()}
    except Uncacheable:
        return None
    cuda_home = environ.get("CUDA_HOME", "")
    return Records.key(
        "toolchain",
        {
            "programs": programs,
            "python": file_identity(venv_python),
            "venv": venv_distributions(venv),
            "cudnn": [file_identity(Path(cuda_home, "include", "cudnn_version.h")), cuda] if cuda else None,
            # the work directory's own paths (its venv's bin/ on PATH) taken out: the same toolchain in
            # another work directory is the same answer
            "vars": {k: (environ.get(k) or "").replace(str(workdir), "{workdir}") for k in VARIABLES},
            "code": file_identity(toolchain.__file__),
        },
    )


def remembered_toolchain(
    environ: Mapping[str, str],
    venv_python: Path,
    records: Records,
    *,
    workdir: Path,
    cuda: bool,
    cache_tool: str | None,
) -> Toolchain:
    """:func:`~torchkiln.host.toolchain.collect`, read back while its key is unchanged."""
    key = _key(environ, venv_python, workdir, cuda, cache_tool)
    kept = records.get(key) if key is not None else None
    if kept is not None:
        try:
            return jsonfile.from_data(Toolchain, kept.get("toolchain"), file=key or "")
        except DocumentError:
            pass
    found = collect(environ, venv_python, cuda=cuda, cache_tool=cache_tool)
    if key is not None:
        records.put(key, {"toolchain": jsonfile.to_data(found)})
    return found
