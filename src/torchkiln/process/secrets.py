"""Credentials for remote stores: loaded from the environment or a file, never printed.

A secret enters torchkiln in exactly one place (:func:`load_secret`) and leaves it only for the one process
that needs it: the compiler cache's server (sccache's, :meth:`torchkiln.cache.tool.CacheTool.server_env`),
torchkiln's own broker (a Redis store, :mod:`torchkiln.cache.broker`), or, where the tool can take it no
other way, the compiles' environment (ccache's HTTP store). The variables secrets come from are taken out of
torchkiln's environment before the build (:func:`take`), so no step inherits them. Everything that
is shown or written (plans, logs, manifests, warnings) goes through :func:`redact` first, which removes
known secret values and the password part of any URL, so a secret that slipped into a URL or an error
message still does not reach the screen.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Mapping, MutableMapping
from pathlib import Path

from torchkiln.errors import UsageError

MASK = "***"

# scheme://userinfo@ - the userinfo (user, user:password or a bare password/token) is masked whole
# when it has a password part, or when it is a single token (ccache: redis://PASSWORD@HOST).
_URL_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^\s/@]+)@")


def _mask_userinfo(match: re.Match[str]) -> str:
    userinfo = match.group("userinfo")
    user, sep, _ = userinfo.partition(":")
    masked = f"{user}:{MASK}" if sep and user else MASK
    return f"{match.group('scheme')}{masked}@"


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every known secret value and every URL password replaced by ``***``.

    Longer secrets are replaced first so that a secret containing another one is masked whole.
    Secrets shorter than 4 characters are still masked: a short password is still a password.
    """
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return _URL_USERINFO.sub(_mask_userinfo, text)


def redact_mapping(values: Mapping[str, str], secrets: Iterable[str] = ()) -> dict[str, str]:
    """A copy of an environment-like mapping with every value redacted."""
    secrets = tuple(secrets)
    return {key: redact(value, secrets) for key, value in values.items()}


def load_secret(
    *,
    env_name: str | None,
    file: str | None,
    environ: Mapping[str, str],
    field: str = "cache",
    env_label: str | None = None,
    file_label: str | None = None,
) -> str | None:
    """The secret named by ``<field>.credentials_env`` or ``<field>.credentials_file``, or None.

    The environment variable wins when both are given and it is set. A named variable that is unset
    or empty, or a file that cannot be read, is a usage error: a build that was told to authenticate
    should not silently run unauthenticated. The value is stripped of surrounding whitespace (files
    usually end with a newline). ``env_label``/``file_label`` name the setting in errors when it is not
    a recipe field (a command-line option such as ``--client-token-env``).
    """
    env_label = env_label or f"{field}.credentials_env"
    file_label = file_label or f"{field}.credentials_file"
    file_hint = "credentials_file" if file_label.startswith(f"{field}.") else file_label
    if env_name:
        value = environ.get(env_name, "").strip()
        if value:
            return value
        if not file:
            raise UsageError(
                f"{env_label}: environment variable {env_name} is not set or empty "
                f"(export it, or name a file with {file_hint})"
            )
    if file:
        path = Path(os.path.expanduser(file))
        try:
            value = path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            raise UsageError(f"{file_label}: {path}: no such file (a file holding the secret)") from None
        except IsADirectoryError:
            raise UsageError(f"{file_label}: {path}: is a directory (a file holding the secret)") from None
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise UsageError(f"{file_label}: {path}: cannot read: {reason}") from None
        if not value:
            raise UsageError(f"{file_label}: {path}: the file is empty (it must hold the secret)")
        return value
    return None


def loose_permissions(file: str | None) -> str | None:
    """A warning when a credentials file is readable by group or others, else None."""
    if not file:
        return None
    path = Path(os.path.expanduser(file))
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        return f"credentials file {path} is readable by other users (chmod 600 {path})"
    return None


def take(environ: MutableMapping[str, str], names: Iterable[str | None]) -> dict[str, str]:
    """Remove the variables ``names`` (those set) from ``environ`` and return them: a secret's variable,
    held by the code that reads it, inherited by no process started afterwards."""
    return {name: environ.pop(name) for name in dict.fromkeys(n for n in names if n) if name in environ}
