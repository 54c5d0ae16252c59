"""What every compiler-cache tool provides: one interface, one implementation per tool.

A tool (:mod:`.ccache`, :mod:`.sccache`, :mod:`.none`) turns a :class:`.config.CacheConfig` into the
environment of a compile step, in two layers (see :mod:`torchkiln.process.environ`):

* :meth:`CacheTool.public_env`: the variables ``torchkiln plan`` shows and the manifest records; never a
  secret, never a masked value;
* :meth:`CacheTool.secret_env`: the variables whose values carry the remote store's credentials, computed
  at run time only: only where the compiles themselves must hold them (ccache's HTTP store, whose URL
  carries them);

and, so that a secret reaches only the one process that needs it, :meth:`CacheTool.server_env` (the
credentials the tool's own server reads when it starts: sccache's; the compiles talk to the server and hold
none) and :meth:`CacheTool.broker` (a store reached through torchkiln, which keeps the credentials: a
Redis store, :mod:`.broker`). It owns its run-time side: :meth:`~CacheTool.start` / :meth:`~CacheTool.stop` (a
server, for sccache, in the build's sandbox when there is one) and its counters (:meth:`~CacheTool.zero_stats`,
:meth:`~CacheTool.read_stats`); :meth:`~CacheTool.step_paths` and :meth:`~CacheTool.step_network` say what a
sandboxed compile step needs of it. :mod:`.session` drives them
for a build. A new tool is a new module with a subclass, and a row in :data:`.registry.TOOLS`; a new remote
back end of a tool is a row in that tool's table.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from torchkiln.errors import TorchkilnError
from torchkiln.process import runner
from torchkiln.process.isolation import Sandbox
from torchkiln.process.runner import Redact

from .broker import RedisBroker
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
        """The variables that carry the remote store's credentials into the compiles, read from ``environ``
        or a file now. Never shown, logged or stored; empty when the store takes no credentials, or when
        they go to the tool's server (:meth:`server_env`) or a broker (:meth:`broker`) instead."""
        return {}

    def server_env(self, config: CacheConfig, environ: Mapping[str, str]) -> dict[str, str]:
        """The variables that carry the remote store's credentials into the tool's own server, which reads
        them when it starts (sccache's); empty for a tool without a server."""
        return {}

    def broker(self, config: CacheConfig, environ: Mapping[str, str]) -> RedisBroker | None:
        """A store reached through torchkiln (:mod:`.broker`), started now: the compiles get its
        :attr:`~.broker.RedisBroker.url` instead of the store's, and no credentials. None: the store is
        reached directly."""
        return None

    def through(
        self, broker: RedisBroker, public: dict[str, str], secret: dict[str, str], server: dict[str, str]
    ) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
        """The public, secret and server layers with the store reached through ``broker``: its socket in
        place of the store's address, and no credentials."""
        return public, secret, server

    def step_paths(self, config: CacheConfig, env: Mapping[str, str]) -> tuple[Path, ...]:
        """What a sandboxed compile step must be able to write for this tool (``env``: the session's
        variables): the cache directory, a statistics log, a socket's directory."""
        return ()

    def step_network(self, config: CacheConfig, env: Mapping[str, str]) -> bool:
        """Whether a compile step needs the network for this tool (a store the compiles reach themselves)."""
        return False

    def run_env(self, config: CacheConfig) -> dict[str, str]:
        """Public variables that differ for each build run (sccache: this build's own server socket)."""
        return {}

    def executable(self, environ: Mapping[str, str]) -> str | None:
        """The tool on ``environ``'s PATH, or None (or None for no tool at all)."""
        return shutil.which(self.kind, path=environ.get("PATH", os.defpath)) if self.kind != "none" else None

    def start(self, env: Mapping[str, str], redact: Redact, sandbox: Sandbox | None = None) -> str | None:
        """Start what the tool needs running for a build (in ``sandbox`` when given: what runs there is
        the build's compiles); the reason it could not, or None."""
        return None

    def stop(self, env: Mapping[str, str], *, now: bool = False) -> None:
        """Stop what :meth:`start` started: asked to finish what it was doing (the cache entries it still
        writes), or with ``now`` (a stop signal: torchkiln must end within 2 s) killed without a word, with
        what it runs; nothing waits on it."""

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
