"""A changed configuration reaches CMake: a compile step's CMake cache is dropped when what configure reads
changed since that build directory was last configured.

torch's setup.py front-end (releases up to 2.13) does not run CMake at all when its build directory holds
``CMakeCache.txt`` and ``build.ninja``: ``CMake.generate`` in tools/setup_helpers/cmake.py returns early
(``# Everything's in place. Do not rerun.``). scikit-build-core's (2.14+) runs it, but cmake/EnvVarForwarding.cmake
fills its passthrough variables (BLAS, TORCH_CUDA_ARCH_LIST, CUDNN_*, ...) only "if DEFINED ENV{...} AND NOT
DEFINED ${...}", and a variable the environment no longer sets stays in the cache. Either way a rebuild with a
changed flag would keep the old configuration while the manifest records the new one.

Upstream's own way out is what this module does: setup.py's ``--cmake`` (``rerun``) removes ``CMakeCache.txt``
before ``generate``, and EnvVarForwarding.cmake says to delete build/ "to reconfigure from scratch". Removing the
cache alone keeps every compiled object and ``.ninja_log``: CMake configures anew, ninja recompiles only what
the new configuration changes, and the compiler cache serves the rest.

What a build directory was configured with is kept in it (:data:`RECORD`), written before the step runs: it
lives and dies with the cache it describes (``--force`` and a hand-removed build/ take both), and a run that
fails after configure still left a true record.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from torchkiln.files import atomic

RECORD = "torchkiln-configure.json"
CACHE = "CMakeCache.txt"
# Variables of a compile step that never reach configure: parallelism (setup.py passes MAX_JOBS to
# `cmake --build`, scikit-build-core reads CMAKE_BUILD_PARALLEL_LEVEL for its build) and the wheel's timestamps.
NOT_CONFIGURE = frozenset({"MAX_JOBS", "CMAKE_BUILD_PARALLEL_LEVEL", "SOURCE_DATE_EPOCH"})
UNKNOWN = "(no record of the configuration it was made with)"


@dataclass(frozen=True)
class Reconfigured:
    """A build directory whose CMake cache was dropped: which variables changed, which caches went."""

    build_dir: Path
    changed: tuple[str, ...]
    removed: tuple[Path, ...]

    def __str__(self) -> str:
        return (
            f"the configuration changed since {self.build_dir} was configured ({', '.join(self.changed)}): "
            f"CMake configures it again (removed {', '.join(p.name for p in self.removed)}; compiled objects "
            "are kept)"
        )


def configure_inputs(env: Mapping[str, str]) -> dict[str, str]:
    """What of a step's environment configure reads (everything but :data:`NOT_CONFIGURE`)."""
    return {name: value for name, value in sorted(env.items()) if name not in NOT_CONFIGURE}


def caches(build_dir: Path) -> list[Path]:
    """The top-level CMake caches under a build directory: ``build/CMakeCache.txt`` (setup.py's) or deeper
    (scikit-build-core's ``build-dir`` may be ``build/{wheel_tag}``). Below a cache nothing is looked at: the
    caches there are ExternalProjects' (NCCL, sleef's host tools), which their own configure keeps."""
    found = []
    for root, dirs, files in os.walk(build_dir):
        if CACHE in files:
            found.append(Path(root) / CACHE)
            dirs.clear()
        dirs.sort()
    return found


def reconfigure(build_dir: Path, env: Mapping[str, str]) -> Reconfigured | None:
    """Before a compile step runs in ``build_dir`` with ``env``: drop its CMake caches when the configuration
    they were made with differs (or is unknown), then record ``env``'s. None: nothing to drop."""
    wanted = configure_inputs(env)
    record = build_dir / RECORD
    previous = _read(record)
    found = caches(build_dir)
    done = None
    if found and previous != wanted:
        for path in found:
            path.unlink()
        done = Reconfigured(build_dir, _changed(previous, wanted), tuple(found))
    build_dir.mkdir(parents=True, exist_ok=True)
    atomic.write_text(record, json.dumps(wanted, indent=1, sort_keys=True) + "\n")
    return done


def _changed(previous: dict[str, str] | None, wanted: dict[str, str]) -> tuple[str, ...]:
    if previous is None:
        return (UNKNOWN,)
    names = sorted(previous.keys() | wanted.keys())
    return tuple(
        f"{name} {previous.get(name, '(unset)')} -> {wanted.get(name, '(unset)')}"
        for name in names
        if previous.get(name) != wanted.get(name)
    )


def _read(record: Path) -> dict[str, str] | None:
    """The recorded configuration; None when absent or unreadable (then it is unknown)."""
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        return None
    return {str(k): v for k, v in data.items()}
