"""This machine's dynamic loader: the libraries its cache knows and the directories it searches by default.

Two readers need them: the SBOM (where a library bundled into a wheel was copied from) and the verification
suite's library-resolution check (whether a wheel's ``NEEDED`` entries resolve without ``LD_LIBRARY_PATH``).
Both ask the loader's own tools instead of guessing: ``ldconfig -p`` prints the cache ``/etc/ld.so.cache``,
and glibc's ``ld.so --help`` (2.33 and later) names its compiled-in "system search path" directories.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from torchkiln.process import runner

_LDCONFIG = re.compile(r"^\s*(\S+)\s+\(.*\)\s+=>\s+(\S+)\s*$")
_SYSTEM_DIR = re.compile(r"^\s+(/\S+) \(system search path\)\s*$")
# glibc's default directories where ld.so cannot say (before 2.33): the multiarch ones (Debian, Ubuntu),
# then lib64 (Fedora, RHEL, manylinux images), then the plain ones.
FALLBACK_SYSTEM_DIRS = (
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
)


def _ldconfig_program() -> str | None:
    """ldconfig lives in /sbin, which a non-root user's PATH often lacks."""
    search = os.pathsep.join([os.environ.get("PATH", ""), "/sbin", "/usr/sbin"])
    return shutil.which("ldconfig", path=search)


def ldconfig_cache() -> dict[str, list[str]]:
    """soname -> paths the dynamic loader's cache knows (``ldconfig -p``); empty where there is none."""
    program = _ldconfig_program()
    if program is None:
        return {}
    try:
        done = runner.run([program, "-p"], timeout=30)
    except runner.ProcessError:
        return {}
    found: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        match = _LDCONFIG.match(line)
        if match:
            found.setdefault(match[1], []).append(match[2])
    return found


def system_search_path(interpreter: str | None) -> tuple[str, ...]:
    """The directories the loader searches after its cache: what ``<interpreter> --help`` lists as
    "(system search path)", else :data:`FALLBACK_SYSTEM_DIRS` that exist. ``interpreter``: the program
    interpreter (PT_INTERP) of the running Python, e.g. ``/lib64/ld-linux-x86-64.so.2``."""
    if interpreter and Path(interpreter).is_file():
        try:
            done = runner.run([interpreter, "--help"], timeout=30)
        except runner.ProcessError:
            done = None
        if done is not None and done.returncode == 0:
            dirs = tuple(m[1] for line in done.stdout.splitlines() if (m := _SYSTEM_DIR.match(line)))
            if dirs:
                return dirs
    return tuple(d for d in FALLBACK_SYSTEM_DIRS if Path(d).is_dir())
