"""The data torchkiln ships (``data/*.toml``: upstream facts and policy, each row naming where it was read)
and the one TOML parser every supported Python has (``tomllib`` from 3.11, the same parser as ``tomli`` on
3.10, which Ubuntu 22.04 ships)."""

from __future__ import annotations

import sys
from importlib import resources
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (Ubuntu 22.04): the same parser, as a package
    import tomli as tomllib

__all__ = ["shipped_toml", "tomllib"]


def shipped_toml(name: str) -> dict[str, Any]:
    """``data/NAME`` as parsed: a file of the package, so a wheel or an editable install reads the same."""
    return tomllib.loads(resources.files("torchkiln").joinpath(f"data/{name}").read_text("utf-8"))
