"""How build servers prove themselves to the scheduler: a shared token, or a JWT per server (preferred).

sccache's docs/Distributed.md ("Server Trust"): with ``jwt_hs256`` the scheduler holds a secret key and
each server gets a token signed for its own address (``IP:PORT``), so a leaked server token lets an attacker
join only if it can also take over that address. With ``token`` every server holds the same secret.

:func:`server_jwt` mints the same token as ``sccache-dist auth generate-jwt-hs256-server-token`` (the tests
compare the two byte for byte) without putting the key on a command line, where ``ps`` would show it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets

from torchkiln.errors import UsageError

SERVER_AUTH_KINDS = ("jwt", "token")
_KEY_BYTES = 32  # sccache-dist's scheduler refuses any other key size ("Size of secret key incorrect")


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def new_key() -> str:
    """A fresh HS256 key in sccache's format (URL-safe base64 of 32 random bytes, no padding)."""
    return _b64url(secrets.token_bytes(_KEY_BYTES))


def check_key(key: str, label: str) -> bytes:
    """The decoded HS256 key; UsageError naming ``label`` (not the key) when sccache-dist would refuse it."""
    if not re.fullmatch(r"[A-Za-z0-9_-]+", key):
        raise UsageError(
            f"{label}: the JWT key is not URL-safe base64 (make one with `torchkiln cluster new-key`)"
        )
    raw = base64.urlsafe_b64decode(key + "=" * (-len(key) % 4))
    if len(raw) != _KEY_BYTES:
        raise UsageError(
            f"{label}: the JWT key is {len(raw)} bytes, sccache-dist needs {_KEY_BYTES} "
            "(make one with `torchkiln cluster new-key`)"
        )
    return raw


def server_jwt(key: str, server_addr: str, label: str = "--server-secret") -> str:
    """The scheduler-signed token of the build server that clients reach at ``server_addr`` (IP:PORT)."""
    raw = check_key(key, label)
    header = _b64url(json.dumps({"typ": "JWT", "alg": "HS256"}, separators=(",", ":")).encode())
    claims = _b64url(json.dumps({"exp": 0, "server_id": server_addr}, separators=(",", ":")).encode())
    signature = hmac.new(raw, f"{header}.{claims}".encode(), hashlib.sha256).digest()
    return f"{header}.{claims}.{_b64url(signature)}"


def jwt_server_addr(token: str) -> str | None:
    """The server address a JWT server token was signed for (unverified), or None when it is no JWT.

    A build server checks this against its own public address before it starts (sccache-dist does too, with
    a less direct message), so a token minted for another server is reported as such.
    """
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, UnicodeDecodeError):
        return None
    addr = claims.get("server_id") if isinstance(claims, dict) else None
    return addr if isinstance(addr, str) else None
