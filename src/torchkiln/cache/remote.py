"""A remote cache store: its URL taken apart, the credentials it is reached with, and what to redact.

The secret itself enters through :func:`torchkiln.process.secrets.load_secret` (``cache.credentials_env`` or
``cache.credentials_file``) and leaves only as variables of a tool's secret layer (see
:meth:`..tool.CacheTool.secret_env`).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from torchkiln.errors import UsageError
from torchkiln.process.secrets import load_secret, redact
from torchkiln.urlform import url_form_problem

from .config import CacheConfig

# URL parameters a scheme takes.
QUERY_PARAMETERS: dict[str, frozenset[str]] = {"s3": frozenset({"region", "endpoint"})}
# Schemes whose host is a bucket's name (its own rule: cache.sccache.BUCKET), not a host.
BUCKETS = ("s3", "gs")
REDIS = ("redis", "rediss")
# A redis database as ccache, sccache and the broker's SELECT read it alike, in its one spelling.
REDIS_DATABASE = re.compile(r"/(?:0|[1-9][0-9]{0,9})", re.ASCII)
REDIS_DATABASE_MAX = 2**32 - 1


@dataclass(frozen=True)
class Remote:
    scheme: str
    host: str
    port: int | None
    path: str
    user: str | None
    password: str | None  # from the URL itself; a recipe uses credentials_env/_file instead
    query: dict[str, str]

    @property
    def netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


def parse_remote(url: str, *, kind: str, schemes: tuple[str, ...], hint: str = "") -> Remote:
    """Take ``url`` apart; a scheme not in ``schemes``, a missing host or an unknown parameter is a
    UsageError naming ``cache.remote`` and what is valid (and :func:`check_form` the rest)."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UsageError(f"cache.remote: malformed URL {redact(url)!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in schemes:
        valid = ", ".join(f"{s}://" for s in schemes)
        shown = scheme + "://" if scheme else repr(redact(url))
        raise UsageError(f"cache.remote: {shown} is not a {kind} remote store (valid: {valid}){hint}")
    if not parts.hostname:
        raise UsageError(f"cache.remote: {redact(url)!r} has no host (valid: {scheme}://HOST[:PORT]...)")
    query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    allowed = QUERY_PARAMETERS.get(scheme, frozenset())
    unknown = sorted(set(query) - allowed)
    if unknown:
        valid = ", ".join(sorted(allowed)) or "no query parameters"
        raise UsageError(
            f"cache.remote: unknown URL parameter {', '.join(unknown)} for {scheme}:// (valid: {valid})"
        )
    user = urllib.parse.unquote(parts.username) if parts.username else None
    password = urllib.parse.unquote(parts.password) if parts.password else None
    if user is not None and password is None and "@" in parts.netloc:
        user, password = None, user  # redis://PASSWORD@HOST is ccache's password-only form
    return Remote(scheme, parts.hostname, port, parts.path, user, password, query)


def check_form(url: str, scheme: str, field: str = "cache.remote") -> None:
    """``url`` written in its one form (torchkiln.urlform), which ccache, sccache and the broker read alike
    (a ``#fragment`` ccache refuses and sccache would drop; ``2130706433`` for 127.0.0.1), a redis database
    written as the number every reader takes it for; else a UsageError naming ``field``."""
    problem = url_form_problem(
        url, user=True, query=scheme in QUERY_PARAMETERS, named_host=scheme not in BUCKETS
    )
    if problem:
        tail = "/DB" if scheme in REDIS else "/PATH"
        raise UsageError(f"{field}: {redact(url)!r}: {problem} (valid: {scheme}://HOST[:PORT][{tail}])")
    path = url.split("://", 1)[1].partition("/")[2].partition("?")[0]
    if (
        scheme in REDIS
        and path
        and not (REDIS_DATABASE.fullmatch("/" + path) and int(path) <= REDIS_DATABASE_MAX)
    ):
        number = path.lstrip("0") or "0"
        write = f": write /{number}" if number.isdigit() and int(number) <= REDIS_DATABASE_MAX else ""
        raise UsageError(
            f"{field}: redis database {path!r} is not a number from 0 to {REDIS_DATABASE_MAX} in "
            f"decimal{write} (valid: {scheme}://HOST[:PORT][/DB])"
        )


def secret_of(config: CacheConfig, remote: Remote, environ: Mapping[str, str]) -> str | None:
    """The remote store's secret: from credentials_env/credentials_file, else the URL's own password."""
    secret = load_secret(env_name=config.credentials_env, file=config.credentials_file, environ=environ)
    return secret if secret is not None else remote.password


def split_user(user: str | None, secret: str) -> tuple[str | None, str]:
    """A secret of the form USER:PASSWORD names the user too (unless the URL already did)."""
    if user is None and ":" in secret:
        head, _, tail = secret.partition(":")
        return head, tail
    return user, secret


def login(config: CacheConfig, remote: Remote, environ: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(user, password) the store is reached with: the URL's own ``user:password``, or the URL's user with a
    ``[USER:]PASSWORD`` secret."""
    secret = secret_of(config, remote, environ)
    if secret is None or remote.password is not None:
        return remote.user, secret
    return split_user(remote.user, secret)


def secret_values(config: CacheConfig, remote: Remote | None, environ: Mapping[str, str]) -> tuple[str, ...]:
    """Every secret string this configuration uses, for :func:`torchkiln.process.secrets.redact`.

    For ``USER:PASSWORD`` secrets the password alone is a secret too (it appears on its own in
    ``SCCACHE_REDIS_PASSWORD``); the part before the colon only when it is long enough to be a key (an S3
    access key id), not a user name such as ``kiln`` that also occurs in ordinary words.
    """
    if remote is None:
        return ()
    secret = load_secret(env_name=config.credentials_env, file=config.credentials_file, environ=environ)
    values = [v for v in (secret, remote.password) if v]
    for value in list(values):
        head, sep, tail = value.partition(":")
        if sep:
            values.append(tail)
            if len(head) >= 16:
                values.append(head)
    return tuple(dict.fromkeys(v for v in values if v))
