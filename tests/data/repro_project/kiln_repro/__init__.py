"""torchkiln's test extension for `torchkiln reproduce`."""

from ._speed import built_at, twice

__all__ = ["built_at", "twice"]
