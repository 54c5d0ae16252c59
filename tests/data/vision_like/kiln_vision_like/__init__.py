"""The benchmark tree's package: torch first (its libraries), then the two extensions."""

import torch  # noqa: F401

from . import _C, image  # noqa: F401
from .version import __version__, git_version  # noqa: F401
