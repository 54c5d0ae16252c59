"""Whether a remote cache store can be used right now: reachable, and taking the credentials.

Checked before a build so that an unreachable store, or one that refuses the credentials, yields ONE warning
and a build with the local cache only (sccache would otherwise fail every compile; ccache would retry the
dead store on every compile). Redis gets a connect, ``AUTH`` and ``PING`` (two commands of its wire
protocol, RESP, spoken here so that no client library is needed); HTTP and WebDAV stores a ``HEAD``
request. Cloud object stores (s3, gs) and memcached are checked by sccache itself when its server starts.
"""

from __future__ import annotations

import base64
import socket
from collections.abc import Mapping

from torchkiln.process.secrets import redact

from .config import CacheConfig
from .registry import remote_of
from .remote import Remote, login

TIMEOUT_S = 3.0
HTTP_SCHEMES = ("http", "https", "webdav+http", "webdav+https")


def _redis_command(sock: socket.socket, *args: str) -> str:
    """Send one RESP command and read one reply line."""
    payload = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
    sock.sendall(payload.encode())
    reply = b""
    while not reply.endswith(b"\r\n"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        reply += chunk
    return reply.decode("utf-8", "replace").strip()


def _check_redis(remote: Remote, user: str | None, password: str | None, shown: str) -> str | None:
    if remote.scheme == "rediss":
        return None  # TLS: left to sccache, which reports it in its statistics
    try:
        with socket.create_connection((remote.host, remote.port or 6379), timeout=TIMEOUT_S) as sock:
            sock.settimeout(TIMEOUT_S)
            if password is not None:
                reply = _redis_command(sock, "AUTH", *([user] if user else []), password)
                if not reply.startswith("+OK"):
                    return (
                        f"remote cache {shown} refuses the credentials ({reply.split(' ', 1)[0].lstrip('-')})"
                    )
            reply = _redis_command(sock, "PING")
            if reply.startswith("-NOAUTH"):
                return f"remote cache {shown} requires a password (set cache.credentials_env or credentials_file)"
            if not reply.startswith("+PONG"):
                return f"remote cache {shown} answered {reply[:40]!r} instead of PONG"
    except OSError as exc:
        return f"remote cache {shown} is unreachable ({exc.strerror or exc})"
    return None


def _check_http(remote: Remote, user: str | None, password: str | None, shown: str) -> str | None:
    import urllib.error  # noqa: PLC0415 - only for an HTTP store (a no-op rebuild probes none)
    import urllib.request  # noqa: PLC0415

    scheme = remote.scheme.removeprefix("webdav+")
    request = urllib.request.Request(f"{scheme}://{remote.netloc}{remote.path or '/'}", method="HEAD")
    if password is not None:
        token = base64.b64encode(f"{user or ''}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S):  # noqa: S310 - http(s) only
            return None
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            return f"remote cache {shown} refuses the credentials (HTTP {exc.code})"
        return None  # 404/405 on the base URL: the server is there
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"remote cache {shown} is unreachable ({getattr(reason, 'strerror', None) or reason})"


def check_remote(config: CacheConfig, environ: Mapping[str, str]) -> str | None:
    """One line saying why the remote store cannot be used (unreachable, credentials refused), or None
    (no store, it answers, or it is one that only its tool can check)."""
    remote = remote_of(config)
    if remote is None or config.remote is None:
        return None
    user, password = login(config, remote, environ)
    shown = redact(config.remote)
    if remote.scheme in ("redis", "rediss"):
        return _check_redis(remote, user, password, shown)
    if remote.scheme in HTTP_SCHEMES:
        return _check_http(remote, user, password, shown)
    return None
