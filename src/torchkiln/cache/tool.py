"""What every compiler-cache tool provides: one interface, one implementation per tool.

A tool (:mod:`.ccache`, :mod:`.sccache`, :mod:`.none`) turns a :class:`.config.CacheConfig` into the
environment of a compile step, in two layers (see :mod:`torchkiln.process.environ`):

* :meth:`CacheTool.public_env`: the variables ``torchkiln plan`` shows and the manifest records; never a
  secret, never a masked value;
* :meth:`CacheTool.secret_env`: the variables whose values carry the remote store's credentials, computed
  at run time only.

and owns its run-time side: :meth:`~CacheTool.start` / :meth:`~CacheTool.stop` (a server, for sccache) and
its counters (:meth:`~CacheTool.zero_stats`, :meth:`~CacheTool.read_stats`). :mod:`.session` drives them
for a build. A new tool is a new module with a subclass, and a row in :data:`.registry.TOOLS`; a new remote
back end of a tool is a row in that tool's table.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping

from torchkiln.errors import TorchkilnError
from torchkiln.process import runner
from torchkiln.process.runner import Redact

from .config import CacheConfig
from .stats import CacheStats

TOOL_TIMEOUT_S = 120.0
# CMake otherwise hands nvcc ``--options-file`` response files, which a cache cannot hash ("multiple input
# files", pytorch PR #106811).
RESPONSE_FILES_OFF = {
    "CMAKE_CUDA_USE_RESPONSE_FILE_FOR_INCLUDES": "OFF",
    "CMAKE_CUDA_USE_RESPONSE_FILE_FOR_LIBRARIES": "OFF",
    "CMAKE_CUDA_USE_RESPONSE_FILE_FOR_OBJECTS": "OFF",
}


def cmake_launchers(tool: str) -> dict[str, str]:
    """``tool`` in front of CMake's C, C++ and CUDA compiles (CMake reads these from the environment, and
    PyTorch's build forwards every ``CMAKE_*`` variable as a cache entry), response files off."""
    return {f"CMAKE_{lang}_COMPILER_LAUNCHER": tool for lang in ("C", "CXX", "CUDA")} | RESPONSE_FILES_OFF


class CacheTool:
    """One compiler-cache program (or none)."""

    kind: str = ""
    # Remote-store URL schemes the tool's back ends take; empty: no remote store.
    schemes: tuple[str, ...] = ()
    # Said when a scheme is not one of ``schemes`` (e.g. which other tool takes it).
    scheme_hint: str = ""

    def public_env(self, config: CacheConfig) -> dict[str, str]:
        """The variables every compile step gets: what the plan shows. ``config.basedir`` (the build's
        work directory) makes cached objects shareable between checkouts at different paths."""
        raise NotImplementedError(f"{type(self).__name__} must say what its compile steps get")

    def secret_env(self, config: CacheConfig, environ: Mapping[str, str]) -> dict[str, str]:
        """The variables that carry the remote store's credentials, read from ``environ`` or a file now.
        Never shown, logged or stored; empty when the store takes no credentials."""
        return {}

    def run_env(self, config: CacheConfig) -> dict[str, str]:
        """Public variables that differ for each build run (sccache: this build's own server socket)."""
        return {}

    def executable(self, environ: Mapping[str, str]) -> str | None:
        """The tool on ``environ``'s PATH, or None (or None for no tool at all)."""
        return shutil.which(self.kind, path=environ.get("PATH", os.defpath)) if self.kind != "none" else None

    def start(self, env: Mapping[str, str], redact: Redact) -> str | None:
        """Start what the tool needs running for a build; the reason it could not, or None."""
        return None

    def stop(self, env: Mapping[str, str]) -> None:
        """Stop what :meth:`start` started."""

    def zero_stats(self, env: Mapping[str, str], redact: Redact) -> None:
        """Reset the counters, so that :meth:`read_stats` after a build reports that build alone."""

    def read_stats(self, env: Mapping[str, str], redact: Redact) -> CacheStats | None:
        """The counters since :meth:`zero_stats`; None for no tool."""
        return None

    def _output(self, argv: list[str], env: Mapping[str, str], redact: Redact) -> str:
        """stdout of the tool; a failure is a TorchkilnError with its first error line (redacted)."""
        try:
            done = runner.run(argv, env=env, timeout=TOOL_TIMEOUT_S, redact=redact)
        except runner.ProcessError as exc:
            raise TorchkilnError(f"{argv[0]} is not installed or not on PATH ({exc})") from None
        if not done.ok:
            raise TorchkilnError(done.failure())
        return done.stdout
