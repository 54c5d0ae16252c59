"""A build's compiler cache at run time: opened before the first compile, closed after the last.

:func:`open_session` gets the tool ready and fixes what the compile steps get (the public and the secret
layer of their environment); :meth:`CacheSession.stats` reads this build's counters (they were zeroed at
open), :meth:`CacheSession.close` reads them a last time and stops what the tool started.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from torchkiln.errors import TorchkilnError, space_on
from torchkiln.process.environ import compose
from torchkiln.process.secrets import loose_permissions, redact

from .config import CacheConfig
from .probe import check_remote
from .registry import remote_of, tool_for
from .remote import secret_values
from .stats import CacheStats
from .tool import CacheTool

SLOWER = "building with the local cache only, this build will be slower"


@dataclass
class CacheSession:
    """The cache of one build run."""

    tool: CacheTool
    config: CacheConfig  # the effective configuration: remote dropped when it cannot be used
    public_env: dict[str, str]  # what compile steps get and the manifest records
    secret_env: dict[str, str]  # added to compile steps' processes only
    environ: dict[str, str]  # what the tool itself runs with (PATH)
    secrets: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    # Run-time variables of another part of the build that the tool's server must start with
    # (SCCACHE_CONF of distributed compiles): not secrets, not part of the plan.
    extra_env: dict[str, str] = field(default_factory=dict)
    closed: bool = field(default=False, init=False)

    def redact(self, text: str) -> str:
        return redact(text, self.secrets)

    @property
    def tool_env(self) -> dict[str, str]:
        return compose(self.environ, self.public_env, self.extra_env, self.secret_env)

    def zero_stats(self) -> None:
        """Reset the counters (opening the session did; a caller may again, e.g. after a configure)."""
        self.tool.zero_stats(self.tool_env, self.redact)

    def stats(self) -> CacheStats | None:
        """This build's counters so far; None for cache kind none."""
        return self.tool.read_stats(self.tool_env, self.redact)

    def close(self) -> CacheStats | None:
        """The build's statistics; stops what the tool started for it."""
        if self.closed:
            return None
        self.closed = True
        try:
            return self.stats()
        finally:
            self.tool.stop(self.tool_env)


def _layers(
    tool: CacheTool, config: CacheConfig, environ: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, str]]:
    public = {**tool.public_env(config), **tool.run_env(config)}
    return public, tool.secret_env(config, environ)


FULL_BELOW = 1 << 20  # free bytes under which a cache directory's filesystem counts as full


def _full(directory: Path) -> str | None:
    """A cache directory on a full filesystem: the tool still runs every compile (ccache counts a
    ``preprocessor_error`` and compiles uncached), so the build succeeds with nothing cached, silently but
    for this one line."""
    try:
        stat = os.statvfs(directory)
    except OSError:
        return None
    if stat.f_bavail * stat.f_frsize >= FULL_BELOW and (stat.f_favail or not stat.f_files):
        return None
    return f"compiler cache {directory}: {space_on(directory)}: compiles run, but nothing is cached"


def open_session(
    config: CacheConfig, environ: Mapping[str, str], extra_env: Mapping[str, str] | None = None
) -> CacheSession:
    """Get the cache ready for a build (``extra_env``: see :attr:`CacheSession.extra_env`).

    * the tool must be on PATH (TorchkilnError otherwise: the CMake launcher would fail every compile);
    * the cache directory is created;
    * a remote store that is unreachable or refuses the credentials yields ONE warning, and the build goes
      on with the local cache only;
    * the tool's server (sccache) is started with this configuration, and the statistics are zeroed.
    """
    tool = tool_for(config)
    secrets = secret_values(config, remote_of(config), environ)
    base = dict(environ)
    if not config.enabled:
        public, secret = _layers(tool, config, environ)
        return CacheSession(tool, config, public, secret, base, secrets)
    if tool.executable(environ) is None:
        raise TorchkilnError(
            f"cache kind {config.kind}: `{config.kind}` is not on PATH (install it, or choose another kind "
            "with --cache ccache|sccache|none)"
        )
    warnings: list[str] = []
    perms = loose_permissions(config.credentials_file)
    if perms:
        warnings.append(perms)
    config.dir.mkdir(parents=True, exist_ok=True)
    full = _full(config.dir)
    if full:
        warnings.append(full)
    problem = check_remote(config, environ)
    if problem is not None:
        warnings.append(f"{redact(problem, secrets)}: {SLOWER}")
        config = config.local_only()
    extra = dict(extra_env or {})
    session = CacheSession(tool, config, *_layers(tool, config, environ), base, secrets, extra_env=extra)
    failure = tool.start(session.tool_env, session.redact)
    if failure is not None and config.remote:
        warnings.append(f"remote cache {redact(config.remote)} cannot be used ({failure}): {SLOWER}")
        config = config.local_only()
        session = CacheSession(tool, config, *_layers(tool, config, environ), base, secrets, extra_env=extra)
        failure = tool.start(session.tool_env, session.redact)
    if failure is not None:
        raise TorchkilnError(f"{config.kind} server does not start: {failure}")
    session.warnings = tuple(warnings)
    tool.zero_stats(session.tool_env, session.redact)
    return session
