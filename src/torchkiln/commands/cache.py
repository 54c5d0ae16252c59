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
import subprocess
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .. import cache as cache_mod
from ..errors import UsageError
from ..recipe import CacheSpec, load_recipe, resolve_recipe_path


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
    return cache_mod.resolve_cache(spec, kind=args.cache, dir=args.cache_dir, remote=args.cache_remote)


def _tool_version(config: cache_mod.CacheConfig) -> str | None:
    path = cache_mod.find_tool(config, os.environ)
    if path is None:
        return None
    done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, check=False)
    return (done.stdout.splitlines() or [""])[0].strip() or None


def _env(config: cache_mod.CacheConfig) -> dict[str, str]:
    return {
        **cache_mod.clean_environment(os.environ),
        **cache_mod.launcher_env(config),
        **cache_mod.secret_env(config, os.environ),
    }


def _show(config: cache_mod.CacheConfig, as_json: bool, console: Console) -> int:
    shown = cache_mod.launcher_env(config)
    secret_names = sorted(set(cache_mod.secret_env(config, os.environ)) - set(shown))
    version = _tool_version(config)
    remote_problem = cache_mod.check_remote(config, os.environ)
    if as_json:
        print(
            json.dumps(
                {
                    "config": config.to_dict(),
                    "env": shown,
                    "secret_variables": secret_names,
                    "tool": version,
                    "remote_problem": remote_problem,
                },
                indent=2,
            )
        )
        return 0
    console.print(f"cache: [bold]{config.kind}[/bold]" + (f" in {config.dir}" if config.enabled else ""))
    if config.enabled:
        console.print(f"tool: {version or f'[red]{config.kind} not found on PATH[/red]'}")
    if config.remote:
        remote = cache_mod.redact(config.remote)
        console.print(
            f"remote: {remote} - " + (f"[yellow]{remote_problem}[/yellow]" if remote_problem else "answers")
        )
    table = Table("variable", "value", title="set for every build step")
    for key, value in shown.items():
        table.add_row(key, value)
    for key in secret_names:
        table.add_row(key, "(secret, added at run time)")
    console.print(table)
    return 0


def run(args: argparse.Namespace) -> int:
    config = _config(args)
    console = Console(highlight=False)
    if args.action == "show":
        return _show(config, args.json, console)
    if not config.enabled:
        raise UsageError(
            f"torchkiln cache {args.action}: the cache kind is none (valid: --cache ccache|sccache)"
        )
    if cache_mod.find_tool(config, os.environ) is None:
        raise UsageError(f"torchkiln cache {args.action}: `{config.kind}` is not on PATH (install it)")
    env = _env(config)
    if args.action == "zero":
        cache_mod.zero_stats(config, env)
        console.print(f"{config.kind} statistics in {config.dir} zeroed")
        return 0
    stats = cache_mod.read_stats(config, env)
    assert stats is not None  # enabled config
    if args.json:
        print(json.dumps(stats.as_dict(), indent=2))
    else:
        console.print(stats.summary())
    return 0
