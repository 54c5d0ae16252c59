"""torchkiln's reproducible test extension."""

from ._speed import twice

__all__ = ["twice"]
