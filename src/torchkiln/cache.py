"""The compiler cache: ccache or sccache in front of every C, C++ and CUDA compile of a build.

One place maps a recipe's ``[cache]`` table (and the CLI overrides) to the tools' own environment
variables, so that every build step (torch's CMake build, torchvision's and extensions'
``torch.utils.cpp_extension`` builds) uses the same cache the same way:

* :func:`resolve_cache` -> :class:`CacheConfig` (recipe + CLI, defaults, validation);
* :func:`launcher_env` -> the variables the plan prints (no secrets: URL passwords are ``***``);
* :func:`secret_env` -> the secret-bearing variables, added to the process environment at run time only;
* :func:`prepare_cache` / :func:`finish_cache` -> the run-time side: tool present, remote reachable
  (else one warning and a build with the local cache only), statistics zeroed and read back;
* :func:`read_stats` / :func:`enforce_min_hit_rate` -> hits, misses and hit rate, local and remote.

Why each launcher variable exists (checked against real builds on torch 2.13.0):

* torch's CMake build: ``CMAKE_{C,CXX,CUDA}_COMPILER_LAUNCHER`` (CMake reads them from the environment,
  and PyTorch's build forwards every ``CMAKE_*`` variable as a cache entry). ``USE_CCACHE`` controls
  PyTorch's own ccache auto-detection, which would otherwise put ccache in front when sccache was asked
  for or no cache at all. ``CMAKE_CUDA_USE_RESPONSE_FILE_FOR_{INCLUDES,LIBRARIES,OBJECTS}=OFF``: CMake
  otherwise hands nvcc ``--options-file`` response files, which the caches cannot hash ("multiple input
  files", pytorch PR #106811).
* ``torch.utils.cpp_extension`` (torchvision, extensions) ignores the CMake variables and puts the first
  of ``ccache``/``sccache`` found on PATH in front of the compiler by itself (``_wrap_compiler``), unless
  ``TORCH_NO_COMPILER_WRAPPER`` is set. So: kind ``none`` sets ``TORCH_NO_COMPILER_WRAPPER=1`` and
  ``CCACHE_DISABLE=1``; kind ``sccache`` sets ``CCACHE_DISABLE=1`` with ``CCACHE_PREFIX=sccache`` so that
  a ccache picked by cpp_extension passes every compile straight to sccache, and
  ``TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES=1`` because sccache cannot cache ``nvcc -MD``.
* Sharing between machines: ``CCACHE_BASEDIR``/``SCCACHE_BASEDIRS`` make absolute paths under the build
  directory relative, and ``CCACHE_NOHASHDIR=1`` keeps the working directory out of the hash (Python's
  sysconfig flags contain ``-g``, which otherwise makes ccache hash the cwd): two builders with different
  checkout paths then hit each other's objects. ``CCACHE_COMPILERCHECK=content`` identifies the compiler by
  its bytes, not its mtime, which differs between machines that installed the same compiler.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .errors import TorchkilnError, UsageError
from .secrets import MASK, load_secret, loose_permissions, redact

KINDS = ("none", "ccache", "sccache")
CCACHE_SCHEMES = ("redis", "http")
SCCACHE_SCHEMES = ("redis", "rediss", "s3", "gs", "memcached", "webdav+http", "webdav+https", "http", "https")
# Variables of the tools that the inherited environment must not contribute: the build's cache is the
# recipe's, not whatever the user's shell happened to export.
INHERITED_PREFIXES = ("CCACHE_", "SCCACHE_")
RESPONSE_FILES_OFF = {
    "CMAKE_CUDA_USE_RESPONSE_FILE_FOR_INCLUDES": "OFF",
    "CMAKE_CUDA_USE_RESPONSE_FILE_FOR_LIBRARIES": "OFF",
    "CMAKE_CUDA_USE_RESPONSE_FILE_FOR_OBJECTS": "OFF",
}
REMOTE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class CacheConfig:
    """The resolved cache settings of one build (recipe ``[cache]`` + command-line overrides)."""

    kind: str
    dir: Path
    max_size: str | None = None
    remote: str | None = None
    credentials_env: str | None = None
    credentials_file: str | None = None

    @property
    def enabled(self) -> bool:
        return self.kind != "none"

    @property
    def tool(self) -> str | None:
        return None if self.kind == "none" else self.kind

    def to_dict(self) -> dict[str, Any]:
        """For the plan and the manifest: the remote URL without its password, credential *sources* only."""
        return {
            "kind": self.kind,
            "dir": str(self.dir) if self.enabled else None,
            "max_size": self.max_size,
            "remote": redact(self.remote) if self.remote else None,
            "credentials_env": self.credentials_env,
            "credentials_file": self.credentials_file,
        }


# --------------------------------------------------------------------------------------------------
# Resolution and validation.
# --------------------------------------------------------------------------------------------------


def default_cache_dir(kind: str, environ: Mapping[str, str] | None = None) -> Path:
    """``$TORCHKILN_CACHE_DIR/<kind>`` or ``~/.cache/torchkiln/<kind>``."""
    environ = os.environ if environ is None else environ
    base = environ.get("TORCHKILN_CACHE_DIR")
    root = Path(base).expanduser() if base else Path.home() / ".cache" / "torchkiln"
    return root / kind


def resolve_cache(
    spec: Any,
    *,
    kind: str | None = None,
    dir: str | Path | None = None,  # noqa: A002 - the recipe field's name
    remote: str | None = None,
    max_size: str | None = None,
    credentials_env: str | None = None,
    credentials_file: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> CacheConfig:
    """Recipe cache settings with command-line overrides applied (the CLI wins), validated.

    ``remote=""`` on the command line removes the recipe's remote store. Raises UsageError naming the
    field when the combination cannot work (an sccache-only backend with ccache, a malformed URL).
    """
    chosen = kind or getattr(spec, "kind", None) or "ccache"
    if chosen not in KINDS:
        raise UsageError(f"cache.kind: {chosen!r} is not a cache kind (valid: {', '.join(KINDS)})")
    raw_dir = dir if dir is not None else getattr(spec, "dir", None)
    cache_dir = Path(raw_dir).expanduser() if raw_dir else default_cache_dir(chosen, environ)
    chosen_remote = remote if remote is not None else getattr(spec, "remote", None)
    config = CacheConfig(
        kind=chosen,
        dir=cache_dir.absolute(),
        max_size=max_size if max_size is not None else getattr(spec, "max_size", None),
        remote=chosen_remote or None,
        credentials_env=credentials_env
        if credentials_env is not None
        else getattr(spec, "credentials_env", None),
        credentials_file=credentials_file
        if credentials_file is not None
        else getattr(spec, "credentials_file", None),
    )
    if config.max_size is not None and not _valid_size(config.max_size):
        raise UsageError(
            f"cache.max_size: malformed size {config.max_size!r} (valid: a size such as 20G or 500M)"
        )
    if config.remote is not None:
        if config.kind == "none":
            raise UsageError(
                "cache.remote: a remote store needs a cache (valid: cache kind ccache or sccache)"
            )
        _parse_remote(config)  # validates
    return config


def _valid_size(size: str) -> bool:
    return re.fullmatch(r"\d+(\.\d+)?[KMGT]i?", size) is not None


@dataclass(frozen=True)
class _Remote:
    scheme: str
    host: str
    port: int | None
    path: str
    user: str | None
    password: str | None  # from the URL itself; a recipe should use credentials_env/_file instead
    query: dict[str, str]


def _parse_remote(config: CacheConfig) -> _Remote:
    url = config.remote or ""
    valid = CCACHE_SCHEMES if config.kind == "ccache" else SCCACHE_SCHEMES
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UsageError(f"cache.remote: malformed URL {redact(url)!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in valid:
        hint = ", ".join(f"{s}://" for s in valid)
        other = (
            "" if config.kind == "sccache" else " (s3://, gs://, memcached://, webdav+https:// need sccache)"
        )
        raise UsageError(
            f"cache.remote: {scheme + '://' if scheme else repr(redact(url))} is not a {config.kind} remote store"
            f" (valid: {hint}){other}"
        )
    if not parts.hostname:
        raise UsageError(f"cache.remote: {redact(url)!r} has no host (valid: {scheme}://HOST[:PORT]...)")
    query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    allowed_query = {"s3": {"region", "endpoint"}}.get(scheme, set())
    unknown = sorted(set(query) - allowed_query)
    if unknown:
        hint = ", ".join(sorted(allowed_query)) or "no query parameters"
        raise UsageError(
            f"cache.remote: unknown URL parameter {', '.join(unknown)} for {scheme}:// (valid: {hint})"
        )
    user = urllib.parse.unquote(parts.username) if parts.username else None
    password = urllib.parse.unquote(parts.password) if parts.password else None
    if user is not None and password is None and "@" in parts.netloc:
        # redis://PASSWORD@HOST is ccache's password-only form.
        user, password = None, user
    return _Remote(scheme, parts.hostname, port, parts.path, user, password, query)


# --------------------------------------------------------------------------------------------------
# Environment: what the plan shows, and the secrets added at run time.
# --------------------------------------------------------------------------------------------------


def clean_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without inherited ccache/sccache settings (CCACHE_*, SCCACHE_*).

    The lead's ``plan.base_environment`` should pass the inherited environment through this so that a
    ``CCACHE_DISABLE`` or ``SCCACHE_BUCKET`` from the user's shell cannot change which cache a build uses.
    """
    return {k: v for k, v in environ.items() if not k.startswith(INHERITED_PREFIXES)}


def _credentials(
    config: CacheConfig, remote: _Remote, environ: Mapping[str, str]
) -> tuple[str | None, str | None]:
    """(user, secret) for the remote: the URL's own userinfo, else credentials_env/credentials_file."""
    secret = load_secret(env_name=config.credentials_env, file=config.credentials_file, environ=environ)
    if secret is None:
        return remote.user, remote.password
    return remote.user, secret


def _split_user(user: str | None, secret: str) -> tuple[str | None, str]:
    """A secret of the form USER:PASSWORD names the user too (unless the URL already did)."""
    if user is None and ":" in secret:
        head, _, tail = secret.partition(":")
        return head, tail
    return user, secret


_URL_SAFE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=")


def _ccache_url(remote: _Remote, user: str | None, password: str | None) -> str:
    netloc = remote.host if remote.port is None else f"{remote.host}:{remote.port}"
    if password is not None:
        if not set(password) <= _URL_SAFE | {"*"} or (user and not set(user) <= _URL_SAFE):
            raise UsageError(
                "cache.credentials: the secret holds characters ccache cannot take in a URL "
                "(valid: letters, digits and -._~!$&'()*+,;=)"
            )
        netloc = f"{user}:{password}@{netloc}" if user else f"{password}@{netloc}"
    return f"{remote.scheme}://{netloc}{remote.path}"


def _ccache_env(config: CacheConfig, password: str | None, user: str | None) -> dict[str, str]:
    env = {
        "CMAKE_C_COMPILER_LAUNCHER": "ccache",
        "CMAKE_CXX_COMPILER_LAUNCHER": "ccache",
        "CMAKE_CUDA_COMPILER_LAUNCHER": "ccache",
        **RESPONSE_FILES_OFF,
        "USE_CCACHE": "1",
        "CCACHE_DIR": str(config.dir),
        "CCACHE_COMPILERCHECK": "content",
        "CCACHE_NOHASHDIR": "1",
    }
    if config.max_size:
        env["CCACHE_MAXSIZE"] = config.max_size
    if config.remote:
        env["CCACHE_REMOTE_STORAGE"] = _ccache_url(_parse_remote(config), user, password)
    return env


_SCCACHE_BACKEND = {
    "redis": "redis",
    "rediss": "redis",
    "s3": "s3",
    "gs": "gcs",
    "memcached": "memcached",
    "webdav+http": "webdav",
    "webdav+https": "webdav",
    "http": "webdav",
    "https": "webdav",
}


def _sccache_remote_env(
    config: CacheConfig, remote: _Remote, user: str | None, secret: str | None
) -> tuple[dict[str, str], dict[str, str]]:
    """(public variables, secret variables) of sccache's backend for the remote URL.

    ``user`` is the URL's user name (public); a user name that comes with the secret (``USER:PASSWORD``)
    is returned among the secret variables, so the plan never shows it.
    """
    netloc = remote.host if remote.port is None else f"{remote.host}:{remote.port}"
    prefix = remote.path.strip("/")
    public: dict[str, str] = {}
    secret_vars: dict[str, str] = {}
    backend = _SCCACHE_BACKEND[remote.scheme]

    def user_and_password(variable_prefix: str) -> str | None:
        if user:
            public[f"{variable_prefix}_USERNAME"] = user
        if secret is None:
            return None
        if remote.password is not None:  # the URL carried user:password itself
            return secret
        secret_user, password = _split_user(user, secret)
        if secret_user and secret_user != user:
            secret_vars[f"{variable_prefix}_USERNAME"] = secret_user
        return password

    if backend == "redis":
        public["SCCACHE_REDIS_ENDPOINT"] = f"{remote.scheme}://{netloc}"
        if prefix:
            if not prefix.isdigit():
                raise UsageError(
                    f"cache.remote: redis database {prefix!r} is not a number (valid: redis://HOST:PORT/0)"
                )
            public["SCCACHE_REDIS_DB"] = prefix
        password = user_and_password("SCCACHE_REDIS")
        if password is not None:
            secret_vars["SCCACHE_REDIS_PASSWORD"] = password
    elif backend == "s3":
        public["SCCACHE_BUCKET"] = remote.host
        if prefix:
            public["SCCACHE_S3_KEY_PREFIX"] = prefix
        if "region" in remote.query:
            public["SCCACHE_REGION"] = remote.query["region"]
        if "endpoint" in remote.query:
            public["SCCACHE_ENDPOINT"] = remote.query["endpoint"]
        if secret is not None:
            key_id, sep, key = secret.partition(":")
            if not sep or not key_id or not key:
                raise UsageError(
                    "cache.credentials: s3:// takes ACCESS_KEY_ID:SECRET_ACCESS_KEY (or leave the credentials out "
                    "and let the AWS environment or instance role supply them)"
                )
            secret_vars["AWS_ACCESS_KEY_ID"] = key_id
            secret_vars["AWS_SECRET_ACCESS_KEY"] = key
    elif backend == "gcs":
        public["SCCACHE_GCS_BUCKET"] = remote.host
        public["SCCACHE_GCS_RW_MODE"] = "READ_WRITE"
        if prefix:
            public["SCCACHE_GCS_KEY_PREFIX"] = prefix
        if config.credentials_env:
            raise UsageError(
                "cache.credentials_env: gs:// takes a service-account key file (valid: cache.credentials_file)"
            )
        if config.credentials_file:
            # sccache reads the key file itself: the path is not the secret, the file's content is.
            public["SCCACHE_GCS_KEY_PATH"] = str(Path(config.credentials_file).expanduser())
    elif backend == "memcached":
        public["SCCACHE_MEMCACHED_ENDPOINT"] = f"tcp://{netloc}"
        password = user_and_password("SCCACHE_MEMCACHED")
        if password is not None:
            secret_vars["SCCACHE_MEMCACHED_PASSWORD"] = password
    else:  # webdav
        scheme = remote.scheme.removeprefix("webdav+")
        public["SCCACHE_WEBDAV_ENDPOINT"] = f"{scheme}://{netloc}{remote.path}"
        if secret is not None and user is None and ":" not in secret:
            secret_vars["SCCACHE_WEBDAV_TOKEN"] = secret
        else:
            password = user_and_password("SCCACHE_WEBDAV")
            if password is not None:
                secret_vars["SCCACHE_WEBDAV_PASSWORD"] = password
    public["SCCACHE_MULTILEVEL_CHAIN"] = f"disk,{backend}"
    return public, secret_vars


def _socket_path(cache_dir: Path) -> str:
    """sccache's server socket for ``cache_dir``: inside it, or in /tmp when that path is too long.

    A Unix socket path is limited to 107 bytes on Linux; a deep cache directory must still work.
    """
    inside = str(cache_dir / "sccache.sock")
    if len(inside.encode()) <= 100:
        return inside
    digest = hashlib.sha256(str(cache_dir).encode()).hexdigest()[:16]
    return str(Path(tempfile.gettempdir()) / f"torchkiln-sccache-{digest}.sock")


def _sccache_env(config: CacheConfig, user: str | None) -> dict[str, str]:
    env = {
        "CMAKE_C_COMPILER_LAUNCHER": "sccache",
        "CMAKE_CXX_COMPILER_LAUNCHER": "sccache",
        "CMAKE_CUDA_COMPILER_LAUNCHER": "sccache",
        **RESPONSE_FILES_OFF,
        "USE_CCACHE": "0",
        # cpp_extension picks ccache first when it is on PATH: make that ccache hand over to sccache.
        "CCACHE_DISABLE": "1",
        "CCACHE_PREFIX": "sccache",
        "TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES": "1",
        "SCCACHE_DIR": str(config.dir),
        "SCCACHE_IDLE_TIMEOUT": "0",
        # The stable name the plan shows (and `torchkiln cache stats` uses); prepare_cache gives each build
        # its own server socket, so builds never share or stop each other's server.
        "SCCACHE_SERVER_UDS": _socket_path(config.dir),
        "SCCACHE_ERROR_LOG": str(config.dir / "sccache-error.log"),
    }
    if config.max_size:
        env["SCCACHE_CACHE_SIZE"] = config.max_size.removesuffix("i")
    if config.remote:
        public, _ = _sccache_remote_env(config, _parse_remote(config), user, None)
        env.update(public)
    return env


def _none_env() -> dict[str, str]:
    return {"USE_CCACHE": "0", "CCACHE_DISABLE": "1", "TORCH_NO_COMPILER_WRAPPER": "1"}


def launcher_env(config: CacheConfig, *, basedir: str | Path | None = None) -> dict[str, str]:
    """The cache variables a build step gets, WITHOUT secrets: what ``torchkiln plan`` prints.

    A password that is part of a URL variable (``CCACHE_REMOTE_STORAGE``) appears as ``***``; variables
    that hold nothing but a secret are left out. :func:`secret_env` supplies both at run time.
    ``basedir`` (the build's work directory) makes cached objects shareable between checkouts at
    different paths.
    """
    if config.kind == "none":
        return _none_env()
    remote = _parse_remote(config) if config.remote else None
    user = remote.user if remote else None
    if config.kind == "ccache":
        has_secret = bool(config.credentials_env or config.credentials_file or (remote and remote.password))
        env = _ccache_env(config, MASK if has_secret else None, user)
        if basedir is not None:
            env["CCACHE_BASEDIR"] = str(Path(basedir).absolute())
        return env
    env = _sccache_env(config, user)
    if basedir is not None:
        env["SCCACHE_BASEDIRS"] = str(Path(basedir).absolute())
    return env


def secret_env(config: CacheConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """The secret-bearing variables, for the build process environment only (never shown or stored).

    Overrides the masked values of :func:`launcher_env` (same keys) and adds the password/key variables.
    Empty when the remote store takes no credentials.
    """
    if config.kind == "none" or not config.remote:
        return {}
    remote = _parse_remote(config)
    user, secret = _credentials(config, remote, environ)
    if config.kind == "ccache":
        if secret is None:
            return {}
        if remote.password is None:
            user, secret = _split_user(user, secret)
        return {"CCACHE_REMOTE_STORAGE": _ccache_url(remote, user, secret)}
    return _sccache_remote_env(config, remote, remote.user, secret)[1]


def secret_values(config: CacheConfig, environ: Mapping[str, str]) -> tuple[str, ...]:
    """Every secret string this configuration uses, for :func:`torchkiln.secrets.redact`.

    For ``USER:PASSWORD`` secrets the password alone is a secret too (it appears on its own in
    ``SCCACHE_REDIS_PASSWORD``); the part before the colon is added only when it is long enough to be a
    key (an S3 access key id), not a user name such as ``kiln`` that also occurs in ordinary words.
    """
    if config.kind == "none" or not config.remote:
        return ()
    remote = _parse_remote(config)
    _, secret = _credentials(config, remote, environ)
    values = [v for v in (secret, remote.password) if v]
    for value in list(values):
        head, sep, tail = value.partition(":")
        if sep:
            values.append(tail)
            if len(head) >= 16:
                values.append(head)
    return tuple(dict.fromkeys(v for v in values if v))


# --------------------------------------------------------------------------------------------------
# Remote reachability.
# --------------------------------------------------------------------------------------------------


def _redis_command(sock: socket.socket, *args: str) -> str:
    payload = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
    sock.sendall(payload.encode())
    reply = b""
    while not reply.endswith(b"\r\n"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        reply += chunk
    return reply.decode("utf-8", "replace").strip()


def _check_redis(remote: _Remote, user: str | None, password: str | None, shown: str) -> str | None:
    port = remote.port or 6379
    if remote.scheme == "rediss":
        return None  # TLS: left to sccache, which reports it in its statistics
    try:
        with socket.create_connection((remote.host, port), timeout=REMOTE_TIMEOUT_S) as sock:
            sock.settimeout(REMOTE_TIMEOUT_S)
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


def _check_http(url: str, shown: str, user: str | None, password: str | None) -> str | None:
    request = urllib.request.Request(url, method="HEAD")
    if password is not None:
        import base64

        token = base64.b64encode(f"{user or ''}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=REMOTE_TIMEOUT_S):  # noqa: S310 - http(s) only
            return None
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            return f"remote cache {shown} refuses the credentials (HTTP {exc.code})"
        return None  # 404/405 on the base URL: the server is there
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"remote cache {shown} is unreachable ({getattr(reason, 'strerror', None) or reason})"


def check_remote(config: CacheConfig, environ: Mapping[str, str]) -> str | None:
    """One line saying why the remote store cannot be used (unreachable, credentials refused), or None.

    Checked directly for Redis and HTTP/WebDAV stores (connect + AUTH + PING, or a HEAD request). Cloud
    object stores (s3, gs) and memcached are checked by sccache itself when its server starts
    (:func:`prepare_cache`).
    """
    if config.kind == "none" or not config.remote:
        return None
    remote = _parse_remote(config)
    user, secret = _credentials(config, remote, environ)
    shown = redact(config.remote)
    if remote.scheme in ("redis", "rediss"):
        if secret is not None and remote.password is None and config.kind == "sccache":
            user, secret = _split_user(user, secret)
        return _check_redis(remote, user, secret, shown)
    if remote.scheme in ("http", "https", "webdav+http", "webdav+https"):
        scheme = remote.scheme.removeprefix("webdav+")
        netloc = remote.host if remote.port is None else f"{remote.host}:{remote.port}"
        if secret is not None:
            user, secret = _split_user(user, secret)
        return _check_http(f"{scheme}://{netloc}{remote.path or '/'}", shown, user, secret)
    return None


# --------------------------------------------------------------------------------------------------
# Statistics.
# --------------------------------------------------------------------------------------------------

# ccache 4.7 counters (``ccache --print-stats``) that mean "a compile the cache could not handle":
# counted against the hit rate, since they are exactly the silent not-caching that a gate must catch.
CCACHE_UNCACHEABLE = (
    "could_not_use_modules",
    "could_not_use_precompiled_header",
    "multiple_source_files",
    "output_to_stdout",
    "unsupported_code_directive",
    "unsupported_compiler_option",
    "unsupported_environment_variable",
    "unsupported_source_language",
)
CCACHE_ERRORS = ("remote_storage_error", "remote_storage_timeout", "internal_error", "missing_cache_file")


@dataclass(frozen=True)
class CacheStats:
    """A build's cache statistics (the counters after the build; they are zeroed before it)."""

    tool: str
    hits: int = 0
    misses: int = 0
    uncacheable: int = 0
    local_hits: int | None = None
    local_misses: int | None = None
    remote_hits: int | None = None
    remote_misses: int | None = None
    errors: int = 0
    by_language: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def compilations(self) -> int:
        return self.hits + self.misses + self.uncacheable

    @property
    def hit_rate(self) -> float | None:
        """hits / (hits + misses + uncacheable compiles); None when nothing was compiled."""
        total = self.compilations
        return self.hits / total if total else None

    def as_dict(self) -> dict[str, Any]:
        rate = self.hit_rate
        return {
            "tool": self.tool,
            "hits": self.hits,
            "misses": self.misses,
            "uncacheable": self.uncacheable,
            "hit_rate": None if rate is None else round(rate, 4),
            "local": {"hits": self.local_hits, "misses": self.local_misses},
            "remote": {"hits": self.remote_hits, "misses": self.remote_misses},
            "errors": self.errors,
            "by_language": {k: {"hits": h, "misses": m} for k, (h, m) in sorted(self.by_language.items())},
        }

    def summary(self) -> str:
        """One line for the build summary."""
        rate = self.hit_rate
        text = f"{self.tool}: {self.hits} hits, {self.misses} misses"
        if self.uncacheable:
            text += f", {self.uncacheable} uncacheable"
        text += f", hit rate {'n/a' if rate is None else f'{rate:.1%}'}"
        if self.local_hits is not None:
            text += f" (local {self.local_hits} hits"
            if self.remote_hits is not None:
                text += f", remote {self.remote_hits} hits"
            text += ")"
        if self.errors:
            text += f", {self.errors} cache errors"
        return text


def parse_ccache_stats(text: str) -> CacheStats:
    """``ccache --print-stats`` (ccache >= 4.x: ``key<TAB>value`` lines)."""
    counters: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("\t")
        if sep and value.strip().lstrip("-").isdigit():
            counters[key.strip()] = int(value)
    if not counters:
        raise TorchkilnError("ccache --print-stats printed no counters (ccache 4.x is required)")
    c = counters.get
    return CacheStats(
        tool="ccache",
        hits=c("direct_cache_hit", 0) + c("preprocessed_cache_hit", 0),
        misses=c("cache_miss", 0),
        uncacheable=sum(c(k, 0) for k in CCACHE_UNCACHEABLE),
        local_hits=c("local_storage_hit", 0),
        local_misses=c("local_storage_miss", 0),
        remote_hits=c("remote_storage_hit", 0),
        remote_misses=c("remote_storage_miss", 0),
        errors=sum(c(k, 0) for k in CCACHE_ERRORS),
    )


def parse_sccache_stats(text: str) -> CacheStats:
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
    )


def _tool_env(config: CacheConfig, env: Mapping[str, str]) -> dict[str, str]:
    """The environment to run the cache tool itself with: the build's env plus the cache variables."""
    merged = dict(env)
    for key, value in launcher_env(config).items():
        merged.setdefault(key, value)
    return merged


# Variables that hold nothing but a secret (URL variables are redacted by their userinfo).
SECRET_VARIABLES = (
    "SCCACHE_REDIS_PASSWORD",
    "SCCACHE_MEMCACHED_PASSWORD",
    "SCCACHE_WEBDAV_PASSWORD",
    "SCCACHE_WEBDAV_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
)


def _run_tool(argv: list[str], env: Mapping[str, str]) -> str:
    try:
        done = subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=120, check=False)
    except FileNotFoundError:
        raise TorchkilnError(f"{argv[0]} is not installed or not on PATH") from None
    except subprocess.TimeoutExpired:
        raise TorchkilnError(f"{' '.join(argv)} did not answer within 120 s") from None
    if done.returncode != 0:
        lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        secrets = [env[name] for name in SECRET_VARIABLES if env.get(name)]
        detail = redact(lines[-1].strip(), secrets) if lines else f"exit status {done.returncode}"
        raise TorchkilnError(f"{' '.join(argv)} failed: {detail}")
    return done.stdout


def read_stats(config: CacheConfig, env: Mapping[str, str]) -> CacheStats | None:
    """The cache's counters (since the last :func:`zero_stats`); None for kind ``none``."""
    if config.kind == "none":
        return None
    env = _tool_env(config, env)
    if config.kind == "ccache":
        return parse_ccache_stats(_run_tool(["ccache", "--print-stats"], env))
    return parse_sccache_stats(_run_tool(["sccache", "--show-stats", "--stats-format=json"], env))


def zero_stats(config: CacheConfig, env: Mapping[str, str]) -> None:
    """Reset the counters so that :func:`read_stats` after a build reports that build alone."""
    if config.kind == "none":
        return
    env = _tool_env(config, env)
    _run_tool([config.kind, "--zero-stats"], env)


def enforce_min_hit_rate(stats: CacheStats | None, minimum: float | None) -> None:
    """``--min-cache-hit-rate``: raise TorchkilnError when the build's hit rate is below ``minimum``.

    A build that compiled nothing passes (nothing could miss). A build without cache statistics fails:
    the gate exists to catch a cache that silently stopped working.
    """
    if minimum is None:
        return
    if not 0.0 <= minimum <= 1.0:
        raise UsageError(f"--min-cache-hit-rate: {minimum} is not a fraction (valid: 0.0 to 1.0, e.g. 0.9)")
    if stats is None:
        raise TorchkilnError(
            f"cache hit rate required >= {minimum:.0%} but the build used no compiler cache (cache kind none)"
        )
    rate = stats.hit_rate
    if rate is None:
        return
    if rate < minimum:
        languages = ""
        if stats.by_language:
            parts = [f"{lang} {h}/{h + m}" for lang, (h, m) in sorted(stats.by_language.items())]
            languages = f"; hits by language: {', '.join(parts)}"
        raise TorchkilnError(
            f"cache hit rate {rate:.1%} is below the required {minimum:.1%} ({stats.hits} hits, "
            f"{stats.misses} misses, {stats.uncacheable} uncacheable{languages}): the compiler cache is "
            "not caching this build"
        )


# --------------------------------------------------------------------------------------------------
# Run time: before and after a build.
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PreparedCache:
    """What a build needs from the cache at run time."""

    config: CacheConfig  # the effective configuration: remote dropped when it cannot be used
    env: dict[str, str]  # launcher_env | secret_env - for the process environment only, never to show
    shown_env: dict[str, str]  # launcher_env of the effective config: safe to print and store
    warnings: tuple[str, ...]
    secrets: tuple[str, ...]

    def redact(self, text: str) -> str:
        return redact(text, self.secrets)


def find_tool(config: CacheConfig, environ: Mapping[str, str]) -> str | None:
    """The cache tool's path on the build's PATH, or None."""
    if config.kind == "none":
        return None
    return shutil.which(config.kind, path=environ.get("PATH", os.defpath))


def prepare_cache(
    config: CacheConfig, environ: Mapping[str, str], *, basedir: str | Path | None = None
) -> PreparedCache:
    """Get the cache ready for a build and return the variables to add to every build step.

    * the tool must be on PATH (TorchkilnError otherwise: the CMake launcher would fail every compile);
    * the cache directory is created;
    * a remote store that is unreachable or refuses the credentials yields ONE warning, and the build
      goes on with the local cache only (sccache would otherwise fail every compile; ccache would retry
      the dead store on every compile);
    * the statistics are zeroed, and sccache's server is (re)started with this configuration.
    """
    secrets = secret_values(config, environ)
    warnings: list[str] = []
    if config.kind == "none":
        env = launcher_env(config)
        return PreparedCache(config, env, dict(env), (), secrets)
    if find_tool(config, environ) is None:
        raise TorchkilnError(
            f"cache kind {config.kind}: `{config.kind}` is not on PATH (install it, or choose another kind "
            "with --cache ccache|sccache|none)"
        )
    perms = loose_permissions(config.credentials_file)
    if perms:
        warnings.append(perms)
    config.dir.mkdir(parents=True, exist_ok=True)
    problem = check_remote(config, environ)
    if problem is not None:
        warnings.append(
            f"{redact(problem, secrets)}: building with the local cache only, this build will be slower"
        )
        config = replace(config, remote=None, credentials_env=None, credentials_file=None)
    shown = launcher_env(config, basedir=basedir)
    env = {**shown, **secret_env(config, environ)}
    if config.kind == "sccache":
        # This build's own server: a second build on the same cache directory must neither reuse a
        # server started with other settings nor stop this one. The plan shows the stable socket name.
        env["SCCACHE_SERVER_UDS"] = _run_socket()
        failure = _start_sccache({**clean_environment(environ), **env}, secrets)
        if failure is not None and config.remote:
            warnings.append(
                f"remote cache {redact(config.remote)} cannot be used ({failure}): building with the local "
                "cache only, this build will be slower"
            )
            config = replace(config, remote=None, credentials_env=None, credentials_file=None)
            shown = launcher_env(config, basedir=basedir)
            env = {**shown, "SCCACHE_SERVER_UDS": env["SCCACHE_SERVER_UDS"]}
            failure = _start_sccache({**clean_environment(environ), **env}, secrets)
        if failure is not None:
            raise TorchkilnError(f"sccache server does not start: {failure}")
    zero_stats(config, {**clean_environment(environ), **env})
    return PreparedCache(config, env, shown, tuple(warnings), secrets)


def _run_socket() -> str:
    """A short, unique Unix socket path for one build's sccache server."""
    return str(Path(tempfile.gettempdir()) / f"torchkiln-sccache-{os.getpid()}-{uuid.uuid4().hex[:8]}.sock")


def _stop_sccache(env: Mapping[str, str]) -> None:
    subprocess.run(["sccache", "--stop-server"], env=dict(env), capture_output=True, timeout=60, check=False)
    sock = Path(env.get("SCCACHE_SERVER_UDS", ""))
    if sock.name and sock.exists():
        sock.unlink()


def _start_sccache(env: Mapping[str, str], secrets: Iterable[str]) -> str | None:
    """Start a server with ``env`` (on its socket); the failure reason, or None."""
    _stop_sccache(env)  # a stale socket file (a crashed server) would block the start
    done = subprocess.run(
        ["sccache", "--start-server"], env=dict(env), capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode == 0:
        return None
    lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    return redact(lines[-1] if lines else f"exit status {done.returncode}", secrets)


def finish_cache(prepared: PreparedCache, environ: Mapping[str, str]) -> CacheStats | None:
    """The build's statistics; stops the sccache server this build started."""
    config = prepared.config
    if config.kind == "none":
        return None
    base = {**clean_environment(environ), **prepared.env}
    try:
        return read_stats(config, base)
    finally:
        if config.kind == "sccache":
            _stop_sccache(base)
