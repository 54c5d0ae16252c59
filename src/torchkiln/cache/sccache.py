"""sccache in front of every C, C++ and CUDA compile: its variables, its remote back ends, its server.

Variables (checked against real builds on torch 2.13.0): the same CMake launchers and response-file switches
as ccache, ``USE_CCACHE=0`` so PyTorch's own ccache detection stays out, and for ``torch.utils.cpp_extension``
(which puts the first of ccache/sccache on PATH in front of the compiler by itself) ``CCACHE_DISABLE=1`` with
``CCACHE_PREFIX=sccache``, so a ccache it picks hands every compile straight to sccache;
``TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES=1`` because sccache cannot cache ``nvcc -MD``.
``SCCACHE_BASEDIRS`` makes paths under the build directory relative, so builders share objects.

Remote back ends are a table, :data:`BACKENDS` (URL scheme -> sccache back end and its variables), layered
after the local disk cache (``SCCACHE_MULTILEVEL_CHAIN=disk,<back end>``).

The server: each build starts its own (:meth:`Sccache.start`) on a socket of its own (in a directory of its
own, 0700), so a second build on the same cache directory neither reuses a server started with other settings
nor stops this one; the plan shows a stable socket name (what ``torchkiln cache stats`` uses).

Secrets: the compiles are sccache clients that talk to the server over its socket and hold none. A Redis
store (``redis://``) is reached through torchkiln's broker (:mod:`.broker`): the server gets a Unix socket and
no password. The other back ends' credentials go to the server alone (:meth:`Sccache.server_env`: sccache
reads ``SCCACHE_*_PASSWORD``, ``AWS_*``... from its environment once, when the server starts), as does the
distributed-compile token (from the file ``SCCACHE_CONF`` names, emptied once the server has read it). The
server runs the compiles it is sent (it preprocesses and compiles itself, and identifies a compiler by running
it with its own environment), so in a sandboxed build it runs in the build's sandbox too (foreground,
``SCCACHE_START_SERVER=1``), with the network its store needs: a compile sent to it sees what a build step
sees, not the signing key or the user's home. The server itself is started from a copy of sccache its user
cannot read (:func:`sealed`), which makes it non-dumpable: the compiles it runs (a tree may name its own
compiler) cannot read its memory (the cluster's token), its environment or its open files through /proc.
What a compiler still gets is the server's environment when sccache identifies it (``CC -E testfile.c``): a
non-Redis store's credentials (docs/supply-chain.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from torchkiln.distributed.stats import ClusterStats
from torchkiln.errors import TorchkilnError, UsageError
from torchkiln.process import runner
from torchkiln.process.isolation import Prepared, Sandbox
from torchkiln.process.runner import Redact
from torchkiln.process.supervisor import pid_alive
from torchkiln.urlreading import HOST_VALID, host_problem, printable_problem

from .broker import RedisBroker, redis_broker
from .config import CacheConfig, size_bytes
from .remote import Remote, parse_remote, secret_of, split_user
from .stats import CacheStats
from .tool import CacheTool, cmake_launchers

Variables = dict[str, str]


@dataclass(frozen=True)
class Backend:
    """One remote store kind: sccache's name for it, its public variables (from the URL and the recipe)
    and the variables that carry its credentials (from the URL's user and the secret)."""

    name: str
    public: Callable[[Remote, CacheConfig], Variables]
    secret: Callable[[Remote, str | None, str], Variables]


def _login_variables(prefix: str, remote: Remote, secret: str) -> Variables:
    """``<prefix>_PASSWORD`` (and ``<prefix>_USERNAME`` when the secret names the user: USER:PASSWORD)."""
    if remote.password is not None:  # the URL carried user:password itself
        return {f"{prefix}_PASSWORD": secret}
    user, password = split_user(remote.user, secret)
    out = {f"{prefix}_PASSWORD": password}
    if user and user != remote.user:
        out[f"{prefix}_USERNAME"] = user
    return out


def _user(prefix: str, remote: Remote) -> Variables:
    return {f"{prefix}_USERNAME": remote.user} if remote.user else {}


def _redis_public(remote: Remote, config: CacheConfig) -> Variables:
    env = {"SCCACHE_REDIS_ENDPOINT": f"{remote.scheme}://{remote.netloc}", **_user("SCCACHE_REDIS", remote)}
    database = remote.path.strip("/")
    if database:
        # sccache parses SCCACHE_REDIS_DB as a u32 (config.rs number_from_env_var)
        if not (database.isascii() and database.isdigit() and int(database) < 2**32):
            raise UsageError(
                f"cache.remote: redis database {database!r} is not a number (valid: redis://HOST:PORT/0)"
            )
        env["SCCACHE_REDIS_DB"] = database
    return env


def _s3_public(remote: Remote, config: CacheConfig) -> Variables:
    env = {"SCCACHE_BUCKET": remote.host}
    if remote.path.strip("/"):
        env["SCCACHE_S3_KEY_PREFIX"] = remote.path.strip("/")
    for parameter, variable in (("region", "SCCACHE_REGION"), ("endpoint", "SCCACHE_ENDPOINT")):
        if parameter in remote.query:
            env[variable] = remote.query[parameter]
    return env


def _s3_secret(remote: Remote, user: str | None, secret: str) -> Variables:
    key_id, sep, key = secret.partition(":")
    if not sep or not key_id or not key:
        raise UsageError(
            "cache.credentials: s3:// takes ACCESS_KEY_ID:SECRET_ACCESS_KEY (or leave the credentials out "
            "and let the AWS environment or instance role supply them)"
        )
    return {"AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": key}


def _gcs_public(remote: Remote, config: CacheConfig) -> Variables:
    env = {"SCCACHE_GCS_BUCKET": remote.host, "SCCACHE_GCS_RW_MODE": "READ_WRITE"}
    if remote.path.strip("/"):
        env["SCCACHE_GCS_KEY_PREFIX"] = remote.path.strip("/")
    if config.credentials_env:
        raise UsageError(
            "cache.credentials_env: gs:// takes a service-account key file (valid: cache.credentials_file)"
        )
    if config.credentials_file:
        # sccache reads the key file itself: the path is not the secret, the file's content is.
        env["SCCACHE_GCS_KEY_PATH"] = str(Path(config.credentials_file).expanduser())
    return env


def _no_secret(remote: Remote, user: str | None, secret: str) -> Variables:
    return {}


def _memcached_public(remote: Remote, config: CacheConfig) -> Variables:
    return {"SCCACHE_MEMCACHED_ENDPOINT": f"tcp://{remote.netloc}", **_user("SCCACHE_MEMCACHED", remote)}


def _webdav_public(remote: Remote, config: CacheConfig) -> Variables:
    scheme = remote.scheme.removeprefix("webdav+")
    return {
        "SCCACHE_WEBDAV_ENDPOINT": f"{scheme}://{remote.netloc}{remote.path}",
        **_user("SCCACHE_WEBDAV", remote),
    }


def _webdav_secret(remote: Remote, user: str | None, secret: str) -> Variables:
    if remote.user is None and ":" not in secret:
        return {"SCCACHE_WEBDAV_TOKEN": secret}  # a bare token
    return _login_variables("SCCACHE_WEBDAV", remote, secret)


_REDIS = Backend("redis", _redis_public, lambda r, u, s: _login_variables("SCCACHE_REDIS", r, s))
_WEBDAV = Backend("webdav", _webdav_public, _webdav_secret)
BACKENDS: dict[str, Backend] = {
    "redis": _REDIS,
    "rediss": _REDIS,
    "s3": Backend("s3", _s3_public, _s3_secret),
    "gs": Backend("gcs", _gcs_public, _no_secret),
    "memcached": Backend(
        "memcached", _memcached_public, lambda r, u, s: _login_variables("SCCACHE_MEMCACHED", r, s)
    ),
    "webdav+http": _WEBDAV,
    "webdav+https": _WEBDAV,
    "http": _WEBDAV,
    "https": _WEBDAV,
}


BUCKET = re.compile(r"[a-z0-9](?:[a-z0-9._-]{0,220}[a-z0-9])?", re.ASCII)


def sccache_size(size: str) -> str:
    """``cache.max_size`` as sccache must get it to read what ccache reads: a byte count. ccache reads
    K/M/G/T as powers of 1000 and Ki/Mi/Gi/Ti as powers of 1024, with a fraction (v4.7.5 src/Util.cpp
    ``parse_size``); sccache reads only an integer with K/M/G/T, as powers of 1024 (src/config.rs
    ``parse_size``), and anything else ("20Gi", "1.5G") as no size at all, keeping its 10G default without a
    word. So "20G" is 20*1000**3 bytes to both, and "1.5Gi" 1.5*1024**3."""
    return str(size_bytes(size))


def as_written(remote: Remote) -> None:
    """sccache takes each variable torchkiln derives from the URL as written (src/config.rs
    ``string_from_env_var``): no percent-decoding, so a ``%XX`` in a bucket, host, key prefix, path or
    parameter would stay three characters. Each must be what it means as written: a host (an ASCII host
    name or IP address: torchkiln.urlreading.host_problem), and the rest printable ASCII without ``%``."""
    if remote.scheme in ("s3", "gs"):  # a bucket's name (S3's and GCS's naming rules: GCS allows '_')
        if not BUCKET.fullmatch(remote.host):
            raise UsageError(
                f"cache.remote: {remote.host!r} is not a bucket name as sccache hands it on (as written) "
                "(valid: lowercase letters, digits, '.', '_', '-', beginning and ending with a letter or digit)"
            )
    else:
        problem = host_problem(remote.host)
        if problem:
            raise UsageError(
                f"cache.remote: as sccache reads it (as written), {problem} (valid: {HOST_VALID})"
            )
    for what, value in (("path", remote.path), *((f"parameter {k}", v) for k, v in remote.query.items())):
        problem = printable_problem(what, value, "as written") or (
            f"its {what} {value!r} holds '%', which sccache does not decode" if "%" in value else None
        )
        if problem:
            raise UsageError(
                f"cache.remote: {problem} (valid: printable ASCII without '%', as sccache reads it)"
            )


def socket_path(cache_dir: Path) -> str:
    """The stable server socket for ``cache_dir``: inside it, or in /tmp when that path is too long (a Unix
    socket path is limited to 107 bytes on Linux; a deep cache directory must still work)."""
    inside = str(cache_dir / "sccache.sock")
    if len(inside.encode()) <= 100:
        return inside
    digest = hashlib.sha256(str(cache_dir).encode()).hexdigest()[:16]
    return str(Path(tempfile.gettempdir()) / f"torchkiln-sccache-{digest}.sock")


def parse_stats(text: str) -> CacheStats:
    """``sccache --show-stats --stats-format=json``; local/remote split from the multi-level levels."""
    try:
        doc = json.loads(text)
        stats = doc["stats"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise TorchkilnError("sccache --show-stats --stats-format=json printed no statistics") from None
    hits = stats.get("cache_hits", {}).get("counts", {})
    misses = stats.get("cache_misses", {}).get("counts", {})
    errors = sum(stats.get("cache_errors", {}).get("counts", {}).values())
    errors += sum(
        int(stats.get(k, 0) or 0) for k in ("cache_timeouts", "cache_read_errors", "cache_write_errors")
    )
    languages = sorted(set(hits) | set(misses))
    local_hits = local_misses = remote_hits = remote_misses = None
    levels = stats.get("multi_level") or []
    if levels:
        local_hits, local_misses = int(levels[0].get("hits", 0)), int(levels[0].get("misses", 0))
        remote_hits = sum(int(level.get("hits", 0)) for level in levels[1:])
        remote_misses = int(levels[-1].get("misses", 0)) if len(levels) > 1 else None
    elif "Local disk" in str(doc.get("cache_location", "")):
        local_hits, local_misses = sum(hits.values()), sum(misses.values())
    return CacheStats(
        tool="sccache",
        hits=sum(hits.values()),
        misses=sum(misses.values()),
        uncacheable=int(stats.get("requests_not_cacheable", 0) or 0),
        local_hits=local_hits,
        local_misses=local_misses,
        remote_hits=remote_hits,
        remote_misses=remote_misses,
        errors=errors,
        by_language={lang: (int(hits.get(lang, 0)), int(misses.get(lang, 0))) for lang in languages},
        cluster=ClusterStats.from_sccache_json(doc),
    )


BROKERED = "redis+unix://localhost"  # SCCACHE_REDIS_ENDPOINT of a store behind torchkiln's broker
SOCKET_PREFIX = "torchkiln-sccache-"
SOCKET_NAME = "server.sock"
START_TIMEOUT_S = 120.0


def stop_orphans(env: Mapping[str, str]) -> list[Path]:
    """Stop the servers of builds that died without stopping theirs (a torchkiln older than its watchdog,
    or one whose watchdog was killed too) and remove their sockets: a socket (or a socket's directory) of
    this form whose build pid is gone. Returns what was removed."""
    removed = []
    for entry in sorted(Path(tempfile.gettempdir()).glob(f"{SOCKET_PREFIX}*")):
        pid = entry.name[len(SOCKET_PREFIX) :].partition("-")[0]
        if not pid.isdigit() or pid_alive(int(pid)):
            continue
        sock = entry / SOCKET_NAME if entry.is_dir() else entry
        runner.run(["sccache", "--stop-server"], env={**env, "SCCACHE_SERVER_UDS": str(sock)}, timeout=30)
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


SEALED_PREFIX = "torchkiln-sccache-bin-"


def sealed(exe: str) -> Path:
    """The sccache to start the server from: a copy its user may execute but not read (mode 0111) in a
    private directory of this build, removed when it ends. The kernel makes a process that executes a file
    its user cannot read non-dumpable (fs/exec.c ``would_dump``): /proc/PID/mem, environ, maps and fd of the
    server then answer EACCES to every process of the same user without CAP_SYS_PTRACE, and it cannot be
    ptraced. So the compiles the server runs (a tree's own compiler among them) cannot read the cluster's
    token or a store's credentials out of it. ``prctl(PR_SET_DUMPABLE, 0)`` in a wrapper would not do: execve
    makes the new program dumpable again (measured: docs/supply-chain.md). A compile run as root with its
    capabilities (no sandbox, as root) still could."""
    found = shutil.which(exe) or exe
    directory = Path(tempfile.mkdtemp(prefix=SEALED_PREFIX))
    runner.remove_at_exit(directory)
    target = directory / "sccache"
    shutil.copyfile(found, target)
    target.chmod(0o111)
    return target


def _server_pid(sock: str) -> int | None:
    """The pid of the process listening on ``sock`` (SO_PEERCRED); None when nothing does."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(sock)
            pid, _, _ = struct.unpack("3i", probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        except OSError:
            return None
    return pid if pid > 0 else None


def _own_group(pid: int) -> int | None:
    """``pid``'s process group, unless it is torchkiln's own (then only ``pid`` may be killed)."""
    try:
        group = os.getpgid(pid)
    except ProcessLookupError:
        return None
    return None if group == os.getpgrp() else group


def _accepting(sock: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(sock)
        except OSError:
            return False
    return True


class Sccache(CacheTool):
    kind = "sccache"
    schemes = tuple(BACKENDS)

    def __init__(self) -> None:
        # servers started in a sandbox, by socket: (the foreground process, its sandbox's /tmp, its output)
        self._servers: dict[str, tuple[subprocess.Popen[bytes], Prepared]] = {}
        # by socket: the unreadable copy each build's server started from (sealed), removed when it stops
        self._sealed: dict[str, Path] = {}

    def _remote(self, config: CacheConfig) -> Remote | None:
        if not config.remote:
            return None
        return parse_remote(config.remote, kind=self.kind, schemes=self.schemes)

    def public_env(self, config: CacheConfig) -> dict[str, str]:
        env = {
            **cmake_launchers("sccache"),
            "USE_CCACHE": "0",
            # cpp_extension picks ccache first when it is on PATH: make that ccache hand over to sccache.
            "CCACHE_DISABLE": "1",
            "CCACHE_PREFIX": "sccache",
            "TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES": "1",
            "SCCACHE_DIR": str(config.dir),
            "SCCACHE_IDLE_TIMEOUT": "0",
            "SCCACHE_SERVER_UDS": socket_path(config.dir),
            "SCCACHE_ERROR_LOG": str(config.dir / "sccache-error.log"),
        }
        if config.max_size:
            env["SCCACHE_CACHE_SIZE"] = sccache_size(config.max_size)
        remote = self._remote(config)
        if remote is not None:
            as_written(remote)
            backend = BACKENDS[remote.scheme]
            env.update(backend.public(remote, config))
            env["SCCACHE_MULTILEVEL_CHAIN"] = f"disk,{backend.name}"
        if config.basedir is not None:
            env["SCCACHE_BASEDIRS"] = str(config.basedir)
        return env

    def server_env(self, config: CacheConfig, environ: Mapping[str, str]) -> dict[str, str]:
        """The store's credentials, for the server (it reads them once, at its start); the compiles, its
        clients, get none."""
        remote = self._remote(config)
        if remote is None:
            return {}
        secret = secret_of(config, remote, environ)
        if secret is None:
            return {}
        return BACKENDS[remote.scheme].secret(remote, remote.user, secret)

    def run_env(self, config: CacheConfig) -> dict[str, str]:
        """This build's own server socket, in a directory of its own (a sandboxed server makes its socket
        there, and the compile steps' sandboxes mount it): short (a Unix socket path has 107 bytes) and
        unique."""
        name = f"{SOCKET_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        return {"SCCACHE_SERVER_UDS": str(Path(tempfile.gettempdir()) / name / SOCKET_NAME)}

    def broker(self, config: CacheConfig, environ: Mapping[str, str]) -> RedisBroker | None:
        """A Redis store (not TLS) through torchkiln's broker: the server then holds no credentials."""
        return redis_broker(config, self._remote(config), environ, "sccache")

    def through(
        self, broker: RedisBroker, public: dict[str, str], secret: dict[str, str], server: dict[str, str]
    ) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
        """The server reaches Redis through the broker's socket: no user, password or database of its own
        (the broker authenticates and selects the URL's database)."""
        public = {k: v for k, v in public.items() if k not in ("SCCACHE_REDIS_DB", "SCCACHE_REDIS_USERNAME")}
        server = {k: v for k, v in server.items() if not k.startswith("SCCACHE_REDIS_")}
        return {**public, "SCCACHE_REDIS_ENDPOINT": broker.url}, secret, server

    def step_paths(self, config: CacheConfig, env: Mapping[str, str]) -> tuple[Path, ...]:
        """The server's socket directory: the compiles are its clients (the cache directory is the
        server's alone)."""
        sock = env.get("SCCACHE_SERVER_UDS")
        return (Path(sock).parent,) if sock else ()

    def start(self, env: Mapping[str, str], redact: Redact, sandbox: Sandbox | None = None) -> str | None:
        """The build's own server, in ``sandbox`` when given (with the network its store needs, its cache
        directory and socket directory writable, the file ``SCCACHE_CONF`` names readable)."""
        stop_orphans(env)
        self.stop(env)  # a stale socket file (a crashed server) would block the start
        sock = env.get("SCCACHE_SERVER_UDS", "")
        if sock:
            Path(sock).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            # also when torchkiln is killed (torchkiln.process.supervisor)
            own = Path(sock).parent.name.startswith(SOCKET_PREFIX)
            runner.remove_at_exit(Path(sock).parent if own else Path(sock))
        exe = sealed(shutil.which("sccache", path=env.get("PATH", os.defpath)) or "sccache")
        self._sealed[str(Path(sock))] = exe
        if sandbox is None or not sock:
            done = runner.run([str(exe), "--start-server"], env=env, timeout=START_TIMEOUT_S, redact=redact)
            return None if done.ok else (done.first_error() or f"exit status {done.returncode}")
        return self._start_sandboxed(env, sock, sandbox, redact, exe)

    def _start_sandboxed(
        self, env: Mapping[str, str], sock: str, sandbox: Sandbox, redact: Redact, exe: Path
    ) -> str | None:
        writable = [Path(sock).parent, Path(env.get("SCCACHE_DIR", sock)).absolute()]
        endpoint = env.get("SCCACHE_REDIS_ENDPOINT", "")
        if endpoint.startswith(BROKERED):  # the broker's socket
            writable.append(Path(endpoint.removeprefix(BROKERED)).parent)
        conf = env.get("SCCACHE_CONF")
        read_only = [exe.parent, *([Path(conf)] if conf else [])]
        inner = sandbox.extended(writable=writable, read_only=read_only, network=True)
        prepared = inner.prepare([str(exe)], {**env, "SCCACHE_START_SERVER": "1", "SCCACHE_NO_DAEMON": "1"})
        output = prepared.tmp / "sccache-server.log" if prepared.tmp else Path(os.devnull)
        with output.open("wb") as log:
            proc = runner.spawn(
                prepared.argv, env=prepared.env, stdout=log, stderr=subprocess.STDOUT, text=False
            )
        self._servers[sock] = (proc, prepared)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _accepting(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                said = output.read_text(errors="replace").strip().splitlines() if output.is_file() else []
                self._reap(sock)
                return redact(said[-1]) if said else f"the server exited with status {proc.returncode}"
            time.sleep(0.02)
        return None

    def _reap(self, sock: str) -> None:
        found = self._servers.pop(sock, None)
        if found is None:
            return
        proc, prepared = found
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        if proc.poll() is None:
            runner.stop_group(proc, grace=5)
        prepared.cleanup()  # its /tmp, the output with it

    def stop(self, env: Mapping[str, str], *, now: bool = False) -> None:
        """Asked to stop (``sccache --stop-server``: the server finishes the compiles in flight and writes
        what they leave to the cache first), or with ``now`` killed at once with them (:meth:`_kill`)."""
        sock = Path(env.get("SCCACHE_SERVER_UDS", ""))
        if now:
            self._kill(str(sock))
        else:
            runner.run(["sccache", "--stop-server"], env=env, timeout=60)
            self._reap(str(sock))
        copy = self._sealed.pop(str(sock), None)  # this build's server's copy (sealed)
        if copy is not None and copy.parent.name.startswith(SEALED_PREFIX):
            shutil.rmtree(copy.parent, ignore_errors=True)
        if sock.name and sock.exists():
            sock.unlink()
        if sock.parent.name.startswith(SOCKET_PREFIX):
            shutil.rmtree(sock.parent, ignore_errors=True)

    def _kill(self, sock: str) -> None:
        """The server at ``sock`` and the compiles it runs, SIGKILLed as one process group: a sandboxed
        server's (torchkiln started its bubblewrap), or a daemon's (it stays in the group of the
        ``sccache --start-server`` that started it, and its compilers with it), found by the socket's peer."""
        found = self._servers.pop(sock, None)
        if found is not None:
            proc, prepared = found
            runner.end_group(proc.pid)
            proc.wait()
            prepared.cleanup()
            return
        pid = _server_pid(sock)
        if pid is not None:
            runner.end_group(_own_group(pid), pid=pid)

    def zero_stats(self, env: Mapping[str, str], redact: Redact) -> None:
        self._output(["sccache", "--zero-stats"], env, redact)

    def read_stats(self, env: Mapping[str, str], redact: Redact) -> CacheStats:
        return parse_stats(self._output(["sccache", "--show-stats", "--stats-format=json"], env, redact))
