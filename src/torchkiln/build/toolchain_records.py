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

Invariant: the same toolchain in another work directory is the same key, and the answer read back there is
what probing there answers. The work directory's own paths (its venv's ``bin/`` on ``PATH``, a program such
as pip's ``ninja`` binary inside the venv, whose identity is that of the file the store's entry shares) are
written as ``{workdir}`` in the key and in the kept answer, and the answer read back names the reader's work
directory. An answer that holds ``{workdir}`` itself is not kept.
"""

from __future__ import annotations

import json
import os
import re
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
PLACEHOLDER = "{workdir}"


def _spellings(workdir: Path) -> list[str]:
    """The work directory as a path in the answer or key may spell it: as given, absolute, resolved."""
    forms = {str(workdir), str(workdir.absolute()), os.path.realpath(workdir)}
    return sorted((f.rstrip("/") for f in forms if f.rstrip("/")), key=len, reverse=True)


def _placeheld(data: Any, workdir: Path) -> Any:
    """``data`` (JSON's types) with the work directory written as :data:`PLACEHOLDER` wherever a string
    names it as a whole path: not after a path's characters, not before a name's (``/w/a`` is not a part of
    ``/w/ab`` or ``/v/w/a``; ``/w/a/bin:/usr/bin`` holds it)."""
    spelled = "|".join(re.escape(f) for f in _spellings(workdir))
    pattern = re.compile(rf"(?<![\w./-])(?:{spelled})(?![\w.-])")
    return _each_string(data, lambda text: pattern.sub(PLACEHOLDER, text))


def _filled(data: Any, workdir: Path) -> Any:
    """What :func:`_placeheld` kept, naming ``workdir``."""
    return _each_string(data, lambda text: text.replace(PLACEHOLDER, str(workdir)))


def _kept_form(data: Any, workdir: Path) -> Any | None:
    """What to keep of an answer: :func:`_placeheld`, when reading it back anywhere gives back ``data``
    there; None when it holds a placeholder of its own or a spelling of the work directory is left in it
    (after a flag's letters, ``-I/w/a``)."""
    kept = _placeheld(data, workdir)
    text = json.dumps(kept)
    if PLACEHOLDER in json.dumps(data) or any(form in text for form in _spellings(workdir)):
        return None
    return kept


def _each_string(data: Any, change: Any) -> Any:
    if isinstance(data, str):
        return change(data)
    if isinstance(data, list):
        return [_each_string(item, change) for item in data]
    if isinstance(data, dict):
        return {key: _each_string(value, change) for key, value in data.items()}
    return data


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
    return file_identity(path)  # the work directory's part of its path placeheld with the key's


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
    parts = {
        "programs": programs,
        "python": file_identity(venv_python),
        "venv": venv_distributions(venv),
        "cudnn": [file_identity(Path(cuda_home, "include", "cudnn_version.h")), cuda] if cuda else None,
        "vars": {k: environ.get(k) or "" for k in VARIABLES},
        "code": file_identity(toolchain.__file__),
        # answers kept before the work directory was placeheld in them name the directory that kept them
        "answer": "placeheld",
    }
    # the work directory's own paths taken out: the same toolchain in another work directory, the same key
    return Records.key("toolchain", _placeheld(parts, workdir))


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
            return jsonfile.from_data(Toolchain, _filled(kept.get("toolchain"), workdir), file=key or "")
        except DocumentError:
            pass
    found = collect(environ, venv_python, cuda=cuda, cache_tool=cache_tool)
    keeping = _kept_form(jsonfile.to_data(found), workdir)
    if key is not None and keeping is not None:
        records.put(key, {"toolchain": keeping})
    return found
