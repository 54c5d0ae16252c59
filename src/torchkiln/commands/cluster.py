"""``torchkiln cluster scheduler|server|status|server-token|new-key``: run and check an sccache-dist cluster.

* ``scheduler``: write the scheduler's config (0600: it holds the tokens) and run ``sccache-dist scheduler``
  in the foreground (for systemd or a container), its log on stderr with secrets masked;
* ``server``: the same for a build server (root, bubblewrap); says once whether it joined the scheduler;
* ``status``: what a build's preflight sees: the scheduler answers, how many servers and cores it has, and
  whether it takes the client token (exit 0 when a build could use it, 1 otherwise);
* ``server-token``: mint a build server's JWT (``--server-auth jwt``) from the scheduler's key;
* ``new-key``: a fresh key or token (32 random bytes, URL-safe base64).

Secrets come from environment variables or files (a BuildKit/Kubernetes secret is a file), never from the
command line: ``--client-token-env NAME`` names a variable, it does not hold the token. Addresses default to
loopback: a cluster is reachable from other machines only with ``--listen``/``--public-addr`` set to them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from torchkiln.cache import default_cache_dir
from torchkiln.distributed import client, cluster, spec, tokens
from torchkiln.errors import EXIT_FAILURE, TorchkilnError, UsageError
from torchkiln.process.secrets import MASK, load_secret, loose_permissions

CLIENT_TOKEN_ENV = spec.DEFAULT_TOKEN_ENV
SERVER_SECRET_ENV = cluster.SERVER_SECRET_ENV
SERVER_TOKEN_ENV = cluster.SERVER_TOKEN_ENV


def _secret_options(parser: argparse.ArgumentParser, name: str, default_env: str, what: str) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        f"--{name}-env",
        metavar="NAME",
        default=None,
        help=f"environment variable holding {what} (default {default_env})",
    )
    group.add_argument(f"--{name}-file", metavar="FILE", default=None, help=f"file holding {what}")


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)

    sched = sub.add_parser(
        "scheduler", allow_abbrev=False, help="run an sccache-dist scheduler in the foreground"
    )
    sched.add_argument(
        "--listen", default=cluster.SCHEDULER_LISTEN, help="IP:PORT to listen on (default %(default)s)"
    )
    sched.add_argument(
        "--dir", type=Path, default=None, help="where its config is written (default: the torchkiln cache)"
    )
    sched.add_argument(
        "--server-auth", choices=("jwt", "token"), default="jwt", help="how servers prove themselves"
    )
    _secret_options(sched, "client-token", CLIENT_TOKEN_ENV, "the token builds present")
    _secret_options(
        sched,
        "server-secret",
        SERVER_SECRET_ENV,
        "the JWT key (or, with --server-auth token, the server token)",
    )
    sched.add_argument(
        "--print-config", action="store_true", help="print the config (secrets masked) and exit"
    )

    server = sub.add_parser(
        "server",
        allow_abbrev=False,
        help="run an sccache-dist build server in the foreground (root, bubblewrap)",
    )
    server.add_argument("--scheduler-url", required=True, help="the scheduler, http(s)://HOST[:PORT]")
    server.add_argument(
        "--listen", default=cluster.SERVER_LISTEN, help="IP:PORT to listen on (default %(default)s)"
    )
    server.add_argument("--public-addr", default=None, help="IP:PORT clients reach it at (default: --listen)")
    server.add_argument(
        "--dir", type=Path, default=None, help="toolchains and sandboxes (default: the torchkiln cache)"
    )
    server.add_argument("--server-auth", choices=("jwt", "token"), default="jwt", help="as the scheduler's")
    _secret_options(
        server, "server-token", SERVER_TOKEN_ENV, "this server's JWT (or the shared server token)"
    )
    server.add_argument(
        "--toolchain-cache-size", default=cluster.TOOLCHAIN_CACHE_SIZE, help="default %(default)s"
    )
    server.add_argument("--bwrap", default=None, help="bubblewrap binary (default: bwrap on PATH)")
    server.add_argument(
        "--print-config", action="store_true", help="print the config (secrets masked) and exit"
    )

    status = sub.add_parser(
        "status", allow_abbrev=False, help="check a scheduler the way a build does before it starts"
    )
    status.add_argument("--scheduler-url", required=True, help="the scheduler, http(s)://HOST[:PORT]")
    _secret_options(status, "credentials", CLIENT_TOKEN_ENV, "the client token")
    status.add_argument("--json", action="store_true", help="print one JSON object")

    mint = sub.add_parser(
        "server-token", allow_abbrev=False, help="mint a build server's JWT from the scheduler's key"
    )
    mint.add_argument("--server", required=True, metavar="IP:PORT", help="the server's public address")
    _secret_options(mint, "server-secret", SERVER_SECRET_ENV, "the scheduler's JWT key")

    sub.add_parser(
        "new-key", allow_abbrev=False, help="print a new random key or token (32 bytes, URL-safe base64)"
    )


def _secret(args: argparse.Namespace, name: str, default_env: str) -> str:
    attr = name.replace("-", "_")
    env_name, file = getattr(args, f"{attr}_env"), getattr(args, f"{attr}_file")
    if env_name is None and file is None:
        env_name = default_env
    value = load_secret(
        env_name=env_name,
        file=file,
        environ=os.environ,
        env_label=f"--{name}-env",
        file_label=f"--{name}-file",
    )
    assert value is not None  # a source is always named
    warning = loose_permissions(file)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    return value


def _work_dir(args: argparse.Namespace, role: str) -> Path:
    # dist-scheduler, dist-server: directories earlier runs made and kept toolchains in (named before issue 48)
    return (args.dir or default_cache_dir(f"dist-{role}")).expanduser().absolute()


def _print_masked(text: str, secrets: tuple[str, ...]) -> None:
    for secret in secrets:
        text = text.replace(secret, MASK)
    print(text, end="")


def _run(role: str, conf: Path, secrets: tuple[str, ...], ready: str, failed: str | None = None) -> int:
    """Run the daemon; print one torchkiln line when its log says it is up (or cannot join)."""
    told = False

    def on_line(line: str) -> None:
        nonlocal told
        if told:
            return
        if role == "server":
            event = cluster.server_log_event(line)
            if event is not None:
                told = True
                kind, detail = event
                message = (
                    ready if kind == "registered" else f"{failed}: {detail} (sccache-dist retries every 10 s)"
                )
                print(f"torchkiln cluster server: {message}", file=sys.stderr, flush=True)
        elif "Scheduler listening for clients" in line:
            told = True
            print(f"torchkiln cluster scheduler: {ready}", file=sys.stderr, flush=True)

    argv = cluster.daemon_argv(role, conf)
    status = cluster.run_foreground(
        argv, cluster.daemon_env(os.environ, secrets), secrets, on_line, sys.stderr
    )
    if status != 0:
        print(f"torchkiln cluster {role}: sccache-dist exited with status {status}", file=sys.stderr)
        return EXIT_FAILURE
    return 0


def _scheduler(args: argparse.Namespace) -> int:
    listen = cluster.socket_addr(args.listen, "--listen")
    settings = cluster.SchedulerSettings(
        listen=listen,
        client_token=_secret(args, "client-token", CLIENT_TOKEN_ENV),
        server_auth=args.server_auth,
        server_secret=_secret(args, "server-secret", SERVER_SECRET_ENV),
    )
    text = cluster.scheduler_config(settings)
    if args.print_config:
        _print_masked(text, settings.secrets())
        return 0
    conf = cluster.write_config(_work_dir(args, "scheduler") / "scheduler.toml", text)
    host = listen.rsplit(":", 1)[0]
    url_host = "HOST" if cluster.is_unspecified(listen) else host
    ready = f"listening on {listen}; builds use scheduler_url = http://{url_host}:{listen.rsplit(':', 1)[1]}"
    return _run("scheduler", conf, settings.secrets(), ready)


def _server(args: argparse.Namespace) -> int:
    listen = cluster.socket_addr(args.listen, "--listen")
    public = cluster.socket_addr(args.public_addr, "--public-addr") if args.public_addr else listen
    bwrap = args.bwrap or shutil.which("bwrap")
    settings = cluster.ServerSettings(
        scheduler_url=spec.scheduler_url(args.scheduler_url, "--scheduler-url"),
        public_addr=public,
        bind_address=listen,
        server_auth=args.server_auth,
        server_token=_secret(args, "server-token", SERVER_TOKEN_ENV),
        work_dir=_work_dir(args, "server"),
        bwrap=bwrap or "/usr/bin/bwrap",
        toolchain_cache_size=cluster.parse_size(args.toolchain_cache_size, "--toolchain-cache-size"),
    )
    text = cluster.server_config(settings)
    if args.print_config:
        _print_masked(text, settings.secrets())
        return 0
    problems = cluster.server_host_problems(bwrap)
    if problems:
        raise TorchkilnError("torchkiln cluster server: " + "; ".join(problems))
    conf = cluster.write_config(settings.work_dir / "server.toml", text)
    ready = f"joined the scheduler at {settings.scheduler_url} as {public}"
    failed = f"cannot join the scheduler at {settings.scheduler_url}"
    return _run("server", conf, settings.secrets(), ready, failed)


def _status(args: argparse.Namespace) -> int:
    wanted = spec.ClusterSpec(
        spec.scheduler_url(args.scheduler_url, "--scheduler-url"),
        credentials_env=args.credentials_env or (None if args.credentials_file else CLIENT_TOKEN_ENV),
        credentials_file=args.credentials_file,
    )
    token = spec.check_token(_secret(args, "credentials", CLIENT_TOKEN_ENV), "--credentials-env")
    check = client.check_scheduler(wanted, token)
    if args.json:
        doc = {
            "scheduler_url": wanted.scheduler_url,
            "usable": check.usable,
            "problem": check.problem,
            "notes": list(check.notes),
            "status": None if check.status is None else vars(check.status),
        }
        print(json.dumps(doc, indent=2))
    else:
        if check.status is not None:
            s = check.status
            print(
                f"scheduler {wanted.scheduler_url}: {s.num_servers} build servers, {s.num_cpus} cores, "
                f"{s.in_progress} jobs in progress"
            )
        # The problem lines never hold the token (client.check_token redacts the scheduler's answer).
        print(check.problem or "; ".join(check.notes) or "usable: the scheduler takes the token")
    return 0 if check.usable else EXIT_FAILURE


def _server_token(args: argparse.Namespace) -> int:
    addr = cluster.socket_addr(args.server, "--server")
    if cluster.is_unspecified(addr):
        raise UsageError(
            f"--server: {addr} is no address clients can connect to (valid: the server's IP:PORT)"
        )
    print(tokens.server_jwt(_secret(args, "server-secret", SERVER_SECRET_ENV), addr, "--server-secret"))
    return 0


def run(args: argparse.Namespace) -> int:
    action = args.cluster_command
    if action == "new-key":
        print(tokens.new_key())
        return 0
    handlers = {"scheduler": _scheduler, "server": _server, "status": _status, "server-token": _server_token}
    return handlers[action](args)
