"""Which tool serves which cache kind, and a configuration resolved and checked against its tool."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchkiln.errors import UsageError

from .ccache import Ccache
from .config import KINDS, CacheConfig, CacheFields, default_cache_dir, valid_size
from .none import NoCache
from .remote import Remote, check_form, parse_remote
from .sccache import Sccache
from .syntax import CCACHE_REMOTE_VALID, ccache_remote_reading_problem, path_problem, remote_problem
from .tool import CacheTool

TOOLS: dict[str, CacheTool] = {"none": NoCache(), "ccache": Ccache(), "sccache": Sccache()}
assert tuple(TOOLS) == KINDS


def tool_for(config: CacheConfig) -> CacheTool:
    return TOOLS[config.kind]


def remote_of(config: CacheConfig) -> Remote | None:
    """The remote store of ``config`` taken apart (checked against its tool's schemes), or None."""
    if not config.remote:
        return None
    tool = tool_for(config)
    return parse_remote(config.remote, kind=config.kind, schemes=tool.schemes, hint=tool.scheme_hint)


def resolve_cache(
    spec: CacheFields | None,
    *,
    kind: str | None = None,
    dir: str | Path | None = None,  # noqa: A002 - the recipe field's name
    remote: str | None = None,
    max_size: str | None = None,
    credentials_env: str | None = None,
    credentials_file: str | None = None,
    environ: Mapping[str, str] | None = None,
    basedir: Path | None = None,
) -> CacheConfig:
    """Recipe cache settings with command-line overrides applied (the CLI wins), validated against the tool.

    ``remote=""`` on the command line removes the recipe's remote store. Raises UsageError naming the
    field when the combination cannot work (an sccache-only back end with ccache, a malformed URL).
    """

    def pick(cli: Any, field: str) -> Any:
        return cli if cli is not None else getattr(spec, field, None)

    chosen = kind or getattr(spec, "kind", None) or "ccache"
    if chosen not in TOOLS:
        raise UsageError(f"cache.kind: {chosen!r} is not a cache kind (valid: {', '.join(TOOLS)})")
    raw_dir = pick(dir, "dir")
    cache_dir = (Path(raw_dir).expanduser() if raw_dir else default_cache_dir(chosen, environ)).absolute()
    # ccache expands $VAR in CCACHE_DIR; refused whichever tool the recipe names (--cache switches it)
    problem = path_problem(str(cache_dir), "ccache")
    if problem:
        raise UsageError(f"{_dir_source(dir, spec, environ)}: {problem} (valid: a path without '$')")
    config = CacheConfig(
        kind=chosen,
        dir=cache_dir,
        max_size=pick(max_size, "max_size"),
        remote=pick(remote, "remote") or None,
        credentials_env=pick(credentials_env, "credentials_env"),
        credentials_file=pick(credentials_file, "credentials_file"),
        basedir=basedir.absolute() if basedir is not None else None,
    )
    if config.max_size is not None and not valid_size(config.max_size):
        raise UsageError(
            f"cache.max_size: malformed size {config.max_size!r} (valid: a size such as 20G or 500M)"
        )
    if config.remote is not None:
        problem = remote_problem(config.remote, chosen)
        field = "--cache-remote" if remote else "cache.remote"
        if problem:
            raise UsageError(f"{field}: {problem} (valid: one store's URL, without '$', spaces or '|')")
        if not config.enabled:
            raise UsageError(
                "cache.remote: a remote store needs a cache (valid: cache kind ccache or sccache)"
            )
        parsed = remote_of(config)  # validates
        assert parsed is not None
        # the URL as ccache itself reads it: decoded and normalised (torchkiln.cache.syntax); then its one
        # written form, which every tool reads alike (torchkiln.urlform)
        reading = ccache_remote_reading_problem(config.remote) if chosen == "ccache" else None
        if reading:
            raise UsageError(f"{field}: {reading} (valid: {CCACHE_REMOTE_VALID})")
        check_form(config.remote, parsed.scheme, field)
        tool_for(config).public_env(config)  # back-end specific checks (a redis database number, ...)
    return config


def _dir_source(cli: str | Path | None, spec: CacheFields | None, environ: Mapping[str, str] | None) -> str:
    """Where the cache directory came from, as the user named it: the option, the field, the variable."""
    if cli is not None:
        return "--cache-dir"
    if getattr(spec, "dir", None):
        return "cache.dir"
    environ = os.environ if environ is None else environ
    return (
        "TORCHKILN_CACHE_DIR" if environ.get("TORCHKILN_CACHE_DIR") else "HOME (the default cache directory)"
    )
