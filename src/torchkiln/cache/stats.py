"""A build's compiler-cache statistics, and the ``--min-cache-hit-rate`` gate.

Each tool reads its own counters into a :class:`CacheStats` (:meth:`..tool.CacheTool.read_stats`); the
counters are zeroed when a build's cache session opens, so what is read afterwards is that build's alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torchkiln.distributed.stats import ClusterStats
from torchkiln.errors import TorchkilnError, UsageError


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
    # sccache: where the compiles ran (read from the same counters); None for tools without a distributed mode
    cluster: ClusterStats | None = None

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


def likely_causes(stats: CacheStats, seen: Sequence[str] = ()) -> list[str]:
    """Why a build missed, as far as can be seen: what the build noticed (``seen``: a source tree or the build
    venv outside the basedir, a compiler that changed since the last build) and what the counters say."""
    causes = list(seen)
    if stats.uncacheable:
        causes.append(
            f"{stats.uncacheable} compiles could not be cached at all (several sources in one call, "
            "unsupported options or languages): fix their command lines, not the cache"
        )
    if stats.errors:
        causes.append(f"{stats.errors} cache errors (remote storage errors or timeouts, missing cache files)")
    if stats.hits == 0 and stats.misses and not causes:
        causes.append(
            "nothing was found in the cache: it is empty or another cache (check the cache dir and remote); "
            "the first build of a tree fills it"
        )
    elif stats.misses and not causes:
        causes.append(
            f"{stats.misses} compiles differ from those that filled the cache: changed sources or flags, or "
            "a builder whose source trees and work directory sit differently relative to each other (paths "
            "outside the basedir are hashed as they are)"
        )
    return causes


def enforce_min_hit_rate(stats: CacheStats | None, minimum: float | None, seen: Sequence[str] = ()) -> None:
    """``--min-cache-hit-rate``: raise TorchkilnError when the build's hit rate is below ``minimum``, naming
    the likely causes (:func:`likely_causes`).

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
        causes = "".join(f"\n  - {cause}" for cause in likely_causes(stats, seen))
        raise TorchkilnError(
            f"cache hit rate {rate:.1%} is below the required {minimum:.1%} ({stats.hits} hits, "
            f"{stats.misses} misses, {stats.uncacheable} uncacheable{languages}); likely causes:{causes}"
        )
