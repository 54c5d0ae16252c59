"""torchkiln's test extension: one op compiled against the installed torch."""

import torch  # noqa: F401 - loads libtorch before the extension

from ._C import scaled_add

__all__ = ["scaled_add"]
