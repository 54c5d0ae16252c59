"""A build's compiler-cache settings: the recipe's ``[cache]`` table with the command line's overrides.

The settings and their defaults live here; what each tool makes of them lives in its own module
(:mod:`.ccache`, :mod:`.sccache`, :mod:`.none`), and :func:`.registry.resolve_cache` applies the command
line's overrides and checks the result against the tool that will use it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

from torchkiln.process.secrets import redact

KINDS = ("none", "ccache", "sccache")


class CacheFields(Protocol):
    """What a recipe's ``[cache]`` table provides (:class:`torchkiln.recipe.model.CacheSpec`)."""

    @property
    def kind(self) -> str: ...
    @property
    def dir(self) -> str | None: ...
    @property
    def max_size(self) -> str | None: ...
    @property
    def remote(self) -> str | None: ...
    @property
    def credentials_env(self) -> str | None: ...
    @property
    def credentials_file(self) -> str | None: ...


@dataclass(frozen=True)
class CacheConfig:
    """The resolved cache settings of one build."""

    kind: str
    dir: Path
    max_size: str | None = None
    remote: str | None = None
    credentials_env: str | None = None
    credentials_file: str | None = None
    # Paths under it are hashed relative to it, so builders whose work directories differ share cached
    # objects (CCACHE_BASEDIR / SCCACHE_BASEDIRS). The plan sets it to the build's work directory, once.
    basedir: Path | None = None

    @property
    def enabled(self) -> bool:
        return self.kind != "none"

    @property
    def has_credentials(self) -> bool:
        """Whether the remote store is reached with a secret (named here, or inside the URL itself)."""
        if not self.remote:
            return False
        return bool(self.credentials_env or self.credentials_file or _url_password(self.remote))

    def local_only(self) -> CacheConfig:
        """The same cache without its remote store (when the store cannot be used)."""
        return replace(self, remote=None, credentials_env=None, credentials_file=None)

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


def _url_password(url: str) -> bool:
    userinfo = url.split("://", 1)[-1].split("/", 1)[0].rpartition("@")[0]
    return bool(userinfo)  # user:password, or a bare PASSWORD@ (ccache's redis form)


def default_cache_dir(kind: str, environ: Mapping[str, str] | None = None) -> Path:
    """``$TORCHKILN_CACHE_DIR/<kind>`` or ``~/.cache/torchkiln/<kind>``."""
    environ = os.environ if environ is None else environ
    base = environ.get("TORCHKILN_CACHE_DIR")
    root = Path(base).expanduser() if base else Path.home() / ".cache" / "torchkiln"
    return root / kind


def valid_size(size: str) -> bool:
    return re.fullmatch(r"[0-9]+(\.[0-9]+)?[KMGT]i?", size, re.ASCII) is not None


_UNITS = {"K": 1, "M": 2, "G": 3, "T": 4}


def size_bytes(size: str) -> int:
    """A recipe's ``cache.max_size`` in bytes, as ccache reads a size with a unit: ``K``, ``M``, ``G``, ``T``
    are powers of 1000, ``Ki`` ... ``Ti`` of 1024, with a fraction (ccache 4.7 and 4.11 alike, v4.7.5
    src/Util.cpp ``parse_size``; only a bare number differs: gigabytes in 4.7, gibibytes from 4.10, which is
    why a recipe's size must have its unit). sccache is given this byte count (cache.sccache.sccache_size)."""
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([KMGT])(i?)", size, re.ASCII)
    if match is None:
        raise ValueError(f"not a size with a unit: {size!r}")
    number, unit, binary = match.groups()
    return int(Decimal(number) * (1024 if binary else 1000) ** _UNITS[unit])
