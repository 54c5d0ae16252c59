"""Where a build's compiles ran: on the cluster, locally, from the cache, or locally after the cluster failed.

Read from sccache's own counters (``sccache --show-stats --stats-format=json``, the same output
:meth:`torchkiln.cache.sccache.Sccache.read_stats` parses for hits and misses), as sccache 0.16.0 counts
them in ``server.rs``:

* ``compilations``: compiler runs, wherever they ran (cache hits are not compilations);
* ``dist_compiles``: ``{server address: count}`` of compiles a build server ran and returned;
* ``dist_errors``: compiles sent to the cluster that failed there (server gone, job refused, sandbox
  error) and were then run locally - the fallbacks;
* ``cache_hits``: compiles served from the cache.

An nvcc compile of one ``.cu`` file is several sccache compiles: the nvcc driver itself (always local:
sccache has no distributed form of it; it runs the steps below and the final host compile through sccache)
and cudafe++, cicc, ptxas and the host g++ compile, which are each distributed and cached on their own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torchkiln.errors import TorchkilnError


@dataclass(frozen=True)
class ClusterStats:
    """A build's compiles by where they ran (counters zeroed before the build)."""

    compilations: int = 0
    remote: int = 0
    fallback: int = 0
    cache_hits: int = 0
    by_server: Mapping[str, int] = field(default_factory=dict)

    @property
    def local(self) -> int:
        """Compiles run on this machine: fallbacks included, and nvcc's driver steps."""
        return self.compilations - self.remote

    @classmethod
    def from_sccache_json(cls, text: str | Mapping[str, Any]) -> ClusterStats:
        """From ``sccache --show-stats --stats-format=json`` output (text, or the parsed document)."""
        try:
            doc = json.loads(text) if isinstance(text, str) else text
            stats = doc["stats"]
            by_server = {str(k): int(v) for k, v in (stats.get("dist_compiles") or {}).items()}
            return cls(
                compilations=int(stats.get("compilations", 0) or 0),
                remote=sum(by_server.values()),
                fallback=int(stats.get("dist_errors", 0) or 0),
                cache_hits=sum(int(v) for v in (stats.get("cache_hits", {}).get("counts") or {}).values()),
                by_server=dict(sorted(by_server.items())),
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            raise TorchkilnError("sccache --show-stats --stats-format=json printed no statistics") from None

    def as_dict(self) -> dict[str, Any]:
        """For the manifest."""
        return {
            "remote": self.remote,
            "local": self.local,
            "cache_hits": self.cache_hits,
            "fallback": self.fallback,
            "by_server": dict(self.by_server),
        }

    def summary(self) -> str:
        """One line for the build summary."""
        text = f"distributed compiles: {self.remote} remote"
        if self.by_server:
            text += f" on {len(self.by_server)} server{'s' if len(self.by_server) != 1 else ''}"
        text += f", {self.local} local, {self.cache_hits} from the cache"
        if self.fallback:
            text += f", {self.fallback} fell back to local"
        return text

    def fallback_warning(self) -> str | None:
        """One warning when compiles the cluster failed had to run locally, else None."""
        if not self.fallback:
            return None
        tried = self.remote + self.fallback
        return (
            f"distributed compiles: {self.fallback} of {tried} compiles sent to the build cluster failed "
            "there (a build server went away or refused the job) and ran locally instead"
        )
