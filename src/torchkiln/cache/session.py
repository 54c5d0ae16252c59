"""A build's compiler cache at run time: opened before the first compile, closed after the last.

:func:`open_session` gets the tool ready and fixes what the compile steps get (the public and the secret
layer of their environment) and what the tool's own server gets (its credentials); :meth:`CacheSession.stats`
reads this build's counters (they were zeroed at open), :meth:`CacheSession.close` reads them a last time and
stops what the tool started (its server, the broker of a store reached through torchkiln).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from torchkiln.errors import TorchkilnError, space_on
from torchkiln.process import runner
from torchkiln.process.environ import compose
from torchkiln.process.isolation import Sandbox
from torchkiln.process.secrets import loose_permissions, redact

from .broker import RedisBroker
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
    server_env: dict[str, str] = field(default_factory=dict)  # the tool's server's credentials, its alone
    broker: RedisBroker | None = None  # the store reached through torchkiln (Redis)
    closed: bool = field(default=False, init=False)

    def redact(self, text: str) -> str:
        return redact(text, self.secrets)

    @property
    def tool_env(self) -> dict[str, str]:
        """What the tool itself runs with (its server, its statistics)."""
        return compose(self.environ, self.public_env, self.extra_env, self.secret_env, self.server_env)

    def step_paths(self) -> tuple[Path, ...]:
        """What a sandboxed compile step must be able to write for the cache (the tool's own answer)."""
        if not self.config.enabled:
            return ()
        return self.tool.step_paths(self.config, self.public_env)

    def step_network(self) -> bool:
        """Whether a sandboxed compile step needs the network for the cache (a store ccache reaches itself)."""
        env = {**self.public_env, **self.secret_env}
        return self.config.enabled and self.tool.step_network(self.config, env)

    def zero_stats(self) -> None:
        """Reset the counters (opening the session did; a caller may again, e.g. after a configure)."""
        self.tool.zero_stats(self.tool_env, self.redact)

    def stats(self) -> CacheStats | None:
        """This build's counters so far; None for cache kind none."""
        return self.tool.read_stats(self.tool_env, self.redact)

    def close(self) -> CacheStats | None:
        """The build's statistics; stops what the tool started for it. A build stopping on a signal
        (:func:`torchkiln.process.runner.stopping`) reads none and kills the tool's server with the compiles
        it runs: nothing waits on it (nothing of an interrupted build is published)."""
        if self.closed:
            return None
        self.closed = True
        now = runner.stopping()
        try:
            return None if now else self.stats()
        finally:
            try:
                self.tool.stop(self.tool_env, now=now)
            finally:
                if self.broker is not None:
                    self.broker.close()


def _layers(
    tool: CacheTool, config: CacheConfig, environ: Mapping[str, str], broker: RedisBroker | None = None
) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """The public, secret and server layers; a broker's socket replaces the store's URL (and its secret)."""
    public = {**tool.public_env(config), **tool.run_env(config)}
    secret, server = tool.secret_env(config, environ), tool.server_env(config, environ)
    if broker is not None:
        return tool.through(broker, public, secret, server)
    return public, secret, server


def _session(
    tool: CacheTool,
    config: CacheConfig,
    environ: Mapping[str, str],
    secrets: tuple[str, ...],
    extra: dict[str, str],
) -> CacheSession:
    broker = tool.broker(config, environ)
    public, secret, server = _layers(tool, config, environ, broker)
    return CacheSession(
        tool,
        config,
        public,
        secret,
        _without_secret(config, environ),
        secrets,
        extra_env=extra,
        server_env=server,
        broker=broker,
    )


def _without_secret(config: CacheConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """What the tool runs with: ``environ`` without the variable the store's secret was read from (its
    server gets the secret as its own variables, or none: a broker holds it)."""
    return {k: v for k, v in environ.items() if k != config.credentials_env}


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
    config: CacheConfig,
    environ: Mapping[str, str],
    extra_env: Mapping[str, str] | None = None,
    sandbox: Sandbox | None = None,
) -> CacheSession:
    """Get the cache ready for a build (``extra_env``: see :attr:`CacheSession.extra_env`; ``sandbox``: where
    the tool's server runs when the build is sandboxed, its compiles being the build's).

    * the tool must be on PATH (TorchkilnError otherwise: the CMake launcher would fail every compile);
    * the cache directory is created;
    * a remote store that is unreachable or refuses the credentials yields ONE warning, and the build goes
      on with the local cache only;
    * a store reached through torchkiln gets its broker (Redis: :mod:`.broker`);
    * the tool's server (sccache) is started with this configuration, and the statistics are zeroed.
    """
    tool = tool_for(config)
    secrets = secret_values(config, remote_of(config), environ)
    base = _without_secret(config, environ)
    if not config.enabled:
        public, secret, server = _layers(tool, config, environ)
        return CacheSession(tool, config, public, secret, base, secrets, server_env=server)
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
    session = _session(tool, config, environ, secrets, extra)
    failure = tool.start(session.tool_env, session.redact, sandbox)
    if failure is not None and config.remote:
        if session.broker is not None:
            session.broker.close()
        warnings.append(f"remote cache {redact(config.remote)} cannot be used ({failure}): {SLOWER}")
        config = config.local_only()
        session = _session(tool, config, environ, secrets, extra)
        failure = tool.start(session.tool_env, session.redact, sandbox)
    if failure is not None:
        raise TorchkilnError(f"{config.kind} server does not start: {failure}")
    session.warnings = tuple(warnings)
    tool.zero_stats(session.tool_env, session.redact)
    return session
