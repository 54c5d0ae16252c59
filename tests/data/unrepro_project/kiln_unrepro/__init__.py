"""torchkiln's non-reproducible control: it knows when it was built."""

from ._stamp import built_at

__all__ = ["built_at"]
