"""The client side's settings: which scheduler, and where its token comes from.

A recipe's ``[cluster]`` section (next to ``[cache]``) and the command-line overrides resolve to one
:class:`ClusterSpec`. The token itself never appears in a recipe or on a command line: the spec names an
environment variable or a file (a BuildKit secret is a file under ``/run/secrets``), exactly as
``cache.credentials_env``/``credentials_file`` do, and :func:`load_token` reads it at run time.

Distributed compiles need sccache as the compiler cache: the sccache client is what sends compiles to the
scheduler (ccache has no distributed mode), so :func:`require_sccache` refuses any other cache kind.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchkiln.errors import UsageError
from torchkiln.process.secrets import load_secret, redact
from torchkiln.urlform import url_form_problem
from torchkiln.urlreading import host_problem

# sccache's [dist.auth] types; torchkiln supports the shared token. The OAuth2 types need a browser
# (``sccache --dist-auth``), which a build machine does not have.
AUTH_KINDS = ("token",)
# Named before issue 48 renamed the cluster's table and options, and kept: the bake file hands this variable to
# docker buildx as the image build's secret (images.bake), one name per secret, where an old name could not
# still be read; scripts and services export it.
DEFAULT_TOKEN_ENV = "TORCHKILN_DIST_TOKEN"
# sccache sends the token as ``Authorization: Bearer <token>``; the scheduler splits the header at the first
# space, so a token is visible ASCII without spaces.
_TOKEN = re.compile(r"[\x21-\x7e]+")


@dataclass(frozen=True)
class ClusterSpec:
    """The resolved distributed-compile settings of one build (recipe ``[cluster]`` + command-line overrides)."""

    scheduler_url: str  # normalised: scheme://host[:port]/
    auth: str = "token"
    credentials_env: str | None = None
    credentials_file: str | None = None

    def endpoint(self, path: str) -> str:
        """The URL of one of the scheduler's API paths (``api/v1/scheduler/status``)."""
        return self.scheduler_url + path.lstrip("/")

    def to_dict(self) -> dict[str, Any]:
        """For the plan and the manifest: the URL (no credentials can be in it), credential *sources* only."""
        return {
            "scheduler_url": redact(self.scheduler_url),
            "auth": self.auth,
            "credentials_env": self.credentials_env,
            "credentials_file": self.credentials_file,
        }


def scheduler_url(url: str, field: str = "cluster.scheduler_url") -> str:
    """``url`` checked the way sccache will read it, normalised to ``scheme://host[:port]/``.

    sccache-dist accepts only http(s) URLs without a path ("relative path (currently unsupported)" in
    sccache's config.rs); a token in the URL would be shown in plans and logs, so it is refused too. It must
    be written in its one form (torchkiln.urlform): the record's URL is the one sccache and torchkiln use.
    """
    valid = "http://HOST[:PORT] or https://HOST[:PORT]"
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise UsageError(f"{field}: malformed URL {redact(url)!r}: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise UsageError(f"{field}: {redact(url)!r} is not an http(s) URL (valid: {valid})")
    if parts.username is not None or parts.password is not None:
        raise UsageError(
            f"{field}: {redact(url)!r} carries credentials (the token comes from credentials_env or "
            "credentials_file, never the URL)"
        )
    if not parts.hostname:
        raise UsageError(f"{field}: {redact(url)!r} has no host (valid: {valid})")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise UsageError(
            f"{field}: {url!r} has a path or query, which sccache-dist does not support (valid: {valid})"
        )
    # sccache-dist parses it with the url crate, which percent-decodes and IDNA-maps an http(s) host, and
    # reads 2130706433 as 127.0.0.1: written in its one form (torchkiln.urlform, urlreading.host_problem),
    # the record names the host it talks to
    problem = url_form_problem(url, root=True) or host_problem(parts.hostname)
    if problem:
        raise UsageError(f"{field}: {redact(url)!r}: {problem} (valid: {valid})")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = host if port is None else f"{host}:{port}"
    return f"{parts.scheme}://{netloc}/"


def require_sccache(cache_kind: str) -> None:
    """UsageError unless the compiler cache is sccache, the one client of sccache-dist: for the recipe's
    ``[cluster]`` and the command line's, and for a spec handed to ``make_plan`` ready-made."""
    if cache_kind != "sccache":
        raise UsageError(
            f"cluster: distributed compiles need the sccache compiler cache, not {cache_kind} "
            "(valid: cache kind sccache, e.g. --cache sccache)"
        )


def resolve_cluster(
    raw: Any,
    *,
    cache_kind: str,
    scheduler_url_override: str | None = None,
    credentials_env: str | None = None,
    credentials_file: str | None = None,
) -> ClusterSpec | None:
    """Recipe ``[cluster]`` settings (any object with the fields, or None) with CLI overrides; None when off.

    ``scheduler_url_override=""`` turns distributed compiles off for one build. Without a credential source
    the token is read from ``$TORCHKILN_DIST_TOKEN``. Raises UsageError naming the field.
    """
    url = (
        scheduler_url_override if scheduler_url_override is not None else getattr(raw, "scheduler_url", None)
    )
    if not url:
        return None
    require_sccache(cache_kind)
    auth = getattr(raw, "auth", None) or "token"
    if auth not in AUTH_KINDS:
        raise UsageError(f"cluster.auth: {auth!r} is not supported (valid: {', '.join(AUTH_KINDS)})")
    env = credentials_env if credentials_env is not None else getattr(raw, "credentials_env", None)
    file = credentials_file if credentials_file is not None else getattr(raw, "credentials_file", None)
    if env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", env):
        raise UsageError(f"cluster.credentials_env: {env!r} is not an environment variable name")
    if not env and not file:
        env = DEFAULT_TOKEN_ENV
    return ClusterSpec(scheduler_url(url), auth, env or None, file or None)


def check_token(token: str, label: str) -> str:
    """``token`` when sccache can send it in an HTTP header; UsageError naming ``label`` (never the token)."""
    if not _TOKEN.fullmatch(token):
        raise UsageError(
            f"{label}: the token holds characters sccache cannot send in an HTTP header "
            "(valid: printable ASCII without spaces)"
        )
    return token


def load_token(spec: ClusterSpec, environ: Mapping[str, str]) -> str:
    """The client token the spec names (environment variable first, then file). UsageError when missing."""
    token = load_secret(
        env_name=spec.credentials_env, file=spec.credentials_file, environ=environ, field="cluster"
    )
    if token is None:  # resolve_cluster always names a source; a hand-made spec may not
        raise UsageError("cluster.credentials_env: no token source (set credentials_env or credentials_file)")
    label = (
        "cluster.credentials_env"
        if spec.credentials_env and environ.get(spec.credentials_env)
        else ("cluster.credentials_file")
    )
    return check_token(token, label)
