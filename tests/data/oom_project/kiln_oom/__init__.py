"""torchkiln's heavy test extension: the sums of its two compiled tables."""

from ._C import table_sums

__all__ = ["table_sums"]
