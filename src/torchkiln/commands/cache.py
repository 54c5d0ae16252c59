"""``torchkiln cache show|stats|zero [RECIPE]``: the compiler cache a build would use, and its counters.

* ``show``: the resolved settings, the variables every build step gets (secrets masked, secret-only
  variables named but not shown), the tool found on PATH and whether the remote store answers;
* ``stats``: hits, misses and hit rate since the counters were last zeroed (local and remote);
* ``zero``: reset the counters.

Without a recipe the defaults apply (ccache in ``$TORCHKILN_CACHE_DIR/ccache`` or
``~/.cache/torchkiln/ccache``); ``--cache``, ``--cache-dir`` and ``--cache-remote`` override as in
``torchkiln plan``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from torchkiln import cache as cache_mod
from torchkiln.cache.ccache import Ccache, parse_printed_size
from torchkiln.cache.config import size_bytes
from torchkiln.errors import UsageError
from torchkiln.printing import Console, LiteralTable, make_console, say, show
from torchkiln.process import runner
from torchkiln.process.environ import compose
from torchkiln.process.secrets import redact
from torchkiln.recipe.loader import load_recipe, resolve_recipe_path
from torchkiln.recipe.model import CacheSpec

from .plan import check_cache_arguments


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("show", "stats", "zero"), help="what to do")
    parser.add_argument(
        "recipe", nargs="?", help="recipe file or shipped recipe name (default: ccache defaults)"
    )
    parser.add_argument(
        "--cache", choices=cache_mod.KINDS, default=None, help="override the recipe's cache kind"
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="override the local cache directory")
    parser.add_argument("--cache-remote", default=None, help="override the remote store URL ('' for none)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _config(args: argparse.Namespace) -> cache_mod.CacheConfig:
    spec = load_recipe(resolve_recipe_path(args.recipe)).cache if args.recipe else CacheSpec()
    # The same rules as plan/build: no password in argv, ~user must expand.
    check_cache_arguments(args, credentials=bool(spec.credentials_env or spec.credentials_file))
    return cache_mod.resolve_cache(spec, kind=args.cache, dir=args.cache_dir, remote=args.cache_remote)


def _tool_version(tool: cache_mod.CacheTool) -> str | None:
    path = tool.executable(os.environ)
    if path is None:
        return None
    done = runner.run([path, "--version"], timeout=30)
    return (done.stdout.splitlines() or [""])[0].strip() or None


def _max_size_read(config: cache_mod.CacheConfig, tool: cache_mod.CacheTool) -> dict[str, object] | None:
    """What ccache makes of cache.max_size (``ccache -k max_size``, printed as 4.7 or 4.10+ print sizes),
    and whether that is the size the recipe meant; None without a max_size or a ccache to ask."""
    if not isinstance(tool, Ccache) or not config.max_size or tool.executable(os.environ) is None:
        return None
    printed = tool.max_size_read(compose(os.environ, tool.public_env(config)), redact)
    got, precision = parse_printed_size(printed)
    return {
        "printed": printed,
        "bytes": round(got),
        "as_meant": abs(got - size_bytes(config.max_size)) <= precision,
    }


def _show(config: cache_mod.CacheConfig, as_json: bool, console: Console) -> int:
    tool = cache_mod.tool_for(config)
    shown = tool.public_env(config)
    secret_names = sorted(tool.secret_env(config, os.environ))
    server_names = sorted(tool.server_env(config, os.environ))
    version = _tool_version(tool)
    remote_problem = cache_mod.check_remote(config, os.environ)
    max_size = _max_size_read(config, tool)
    if as_json:
        print(
            json.dumps(
                {
                    "config": config.to_dict(),
                    "env": shown,
                    "secret_variables": secret_names,
                    "server_secret_variables": server_names,
                    "tool": version,
                    "remote_problem": remote_problem,
                    "max_size_read": max_size,
                },
                indent=2,
            )
        )
        return 0
    say(console, "cache: ", (config.kind, "bold"), f" in {config.dir}" if config.enabled else "")
    if config.enabled:
        say(console, "tool: ", version or (f"{config.kind} not found on PATH", "red"))
    if max_size is not None:
        said = f"max_size: {config.max_size}, which {config.kind} reads as {max_size['printed']}"
        say(console, said if max_size["as_meant"] else (f"{said}: not the size meant", "red"))
    if config.remote:
        remote = redact(config.remote)
        say(console, f"remote: {remote} - ", (remote_problem, "yellow") if remote_problem else "answers")
    table = LiteralTable("variable", "value", title="set for every build step")
    for key, value in shown.items():
        table.add_row(key, value)
    for key in secret_names:
        table.add_row(key, "(secret, added at run time)")
    for key in server_names:
        table.add_row(key, f"(secret, for the {config.kind} server only: the compiles get none)")
    show(console, table)
    return 0


def run(args: argparse.Namespace) -> int:
    config = _config(args)
    console = make_console()
    if args.action == "show":
        return _show(config, args.json, console)
    if not config.enabled:
        raise UsageError(
            f"torchkiln cache {args.action}: the cache kind is none (valid: --cache ccache|sccache)"
        )
    tool = cache_mod.tool_for(config)
    if tool.executable(os.environ) is None:
        raise UsageError(f"torchkiln cache {args.action}: `{config.kind}` is not on PATH (install it)")
    # the statistics may start the tool's server (sccache): it gets the store's credentials, as in a build
    env = compose(
        os.environ,
        tool.public_env(config),
        tool.secret_env(config, os.environ),
        tool.server_env(config, os.environ),
    )
    if args.action == "zero":
        tool.zero_stats(env, redact)
        say(console, f"{config.kind} statistics in {config.dir} zeroed")
        return 0
    stats = tool.read_stats(env, redact)
    assert stats is not None  # enabled config
    if args.json:
        print(json.dumps(stats.as_dict(), indent=2))
    else:
        say(console, stats.summary())
    return 0
