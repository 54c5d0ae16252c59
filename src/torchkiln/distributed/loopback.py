"""A whole cluster on this machine's loopback: one scheduler and N build servers on 127.0.0.1.

For the tests, the benchmark and for trying sccache-dist out before deploying it. Everything listens on
127.0.0.1 only, each daemon on its own free port (servers are told apart by their address, and the
scheduler checks that a server's requests come from the IP its token names, so 127.0.0.1 with distinct
ports is the loopback setup that works). Needs what a real build server needs: root and bubblewrap.
"""

from __future__ import annotations

import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from .client import SchedulerStatus, write_private
from .cluster import (
    SchedulerSettings,
    ServerSettings,
    scheduler_config,
    server_config,
    start,
    stop,
    wait_for_servers,
)
from .tokens import new_key, server_jwt

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass
class LoopbackCluster:
    """A scheduler and ``servers`` build servers under ``root``; use as a context manager."""

    root: Path
    servers: int = 2
    bwrap: str = "/usr/bin/bwrap"
    client_token: str = field(default_factory=new_key)
    server_auth: str = "jwt"
    server_secret: str = field(default_factory=new_key)
    scheduler_port: int = field(default_factory=free_port)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.scheduler_port}/"

    @property
    def server_addrs(self) -> list[str]:
        return [name for name in self.processes if name != "scheduler"]

    def server_token(self, addr: str, secret: str | None = None) -> str:
        """The token of the server at ``addr``: minted from ``secret`` (default: the scheduler's)."""
        secret = secret or self.server_secret
        return server_jwt(secret, addr) if self.server_auth == "jwt" else secret

    def start(self, timeout: float = 30.0) -> SchedulerStatus:
        """Start the scheduler and the servers; wait until every server has registered."""
        settings = SchedulerSettings(
            f"{HOST}:{self.scheduler_port}", self.client_token, self.server_auth, self.server_secret
        )
        conf = self.root / "scheduler" / "scheduler.toml"
        write_private(conf, scheduler_config(settings))
        self._start("scheduler", conf)
        wait_for_servers(self.url, 0, timeout, self.processes["scheduler"])
        for _ in range(self.servers):
            self.add_server()
        return wait_for_servers(self.url, self.servers, timeout, self.processes["scheduler"])

    def add_server(self, secret: str | None = None) -> str:
        """Start one more build server; its address. ``secret``: sign its token with another key."""
        addr = f"{HOST}:{free_port()}"
        work = self.root / f"server-{addr.rsplit(':', 1)[1]}"
        settings = ServerSettings(
            self.url, addr, self.server_auth, self.server_token(addr, secret), work, self.bwrap
        )
        conf = work / "server.toml"
        write_private(conf, server_config(settings))
        self._start(addr, conf)
        return addr

    def _start(self, name: str, conf: Path) -> None:
        log = conf.with_suffix(".log")
        self.logs[name] = log
        self.processes[name] = start("scheduler" if name == "scheduler" else "server", conf, log)

    def kill_server(self, addr: str) -> None:
        """SIGKILL one build server: it goes away as a crashed machine would, without a goodbye."""
        process = self.processes[addr]
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)

    def log(self, name: str) -> str:
        return self.logs[name].read_text(errors="replace") if name in self.logs else ""

    def stop(self) -> None:
        for name in [n for n in self.processes if n != "scheduler"] + ["scheduler"]:
            if name in self.processes:
                stop(self.processes[name])

    def __enter__(self) -> LoopbackCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
