"""The compiler cache: ccache or sccache in front of every C, C++ and CUDA compile of a build.

One module per concern:

* :mod:`.config`: the recipe's ``[cache]`` table with the command line's overrides (:class:`CacheConfig`);
* :mod:`.registry`: which tool serves which kind (:data:`TOOLS`), :func:`resolve_cache`;
* :mod:`.tool`: the interface every tool implements (:class:`CacheTool`: public and secret variables,
  server, counters); :mod:`.none`, :mod:`.ccache`, :mod:`.sccache`: the tools, each with its remote back
  ends as a table;
* :mod:`.remote`: remote-store URLs and credentials; :mod:`.probe`: is the store usable right now;
* :mod:`.session`: a build's cache at run time (:func:`open_session`); :mod:`.stats`: counters and the
  ``--min-cache-hit-rate`` gate.

May import: :mod:`torchkiln.distributed` (sccache's distributed statistics), :mod:`torchkiln.process`,
:mod:`torchkiln.errors`. Never the recipe, the plan, the build or the commands.
"""

from __future__ import annotations

from .config import KINDS, CacheConfig, default_cache_dir
from .probe import check_remote
from .registry import TOOLS, remote_of, resolve_cache, tool_for
from .session import CacheSession, open_session
from .stats import CacheStats, enforce_min_hit_rate, likely_causes
from .tool import CacheTool

__all__ = [
    "KINDS",
    "TOOLS",
    "CacheConfig",
    "CacheSession",
    "CacheStats",
    "CacheTool",
    "check_remote",
    "default_cache_dir",
    "enforce_min_hit_rate",
    "likely_causes",
    "open_session",
    "remote_of",
    "resolve_cache",
    "tool_for",
]
