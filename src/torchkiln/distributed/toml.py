"""A TOML writer for sccache's flat config files (tables of strings, integers and booleans).

The standard library reads TOML but does not write it, and ``tomli-w`` is only a test dependency; the
sccache configs need nothing but ``key = value`` lines in a few tables, so this is all there is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

Value = str | int | bool


def value(item: Value) -> str:
    """One TOML value. Strings are JSON-escaped: valid TOML basic strings (\\", \\\\, \\uXXXX)."""
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, int):
        return str(item)
    return json.dumps(item)


def render(tables: Mapping[str, Mapping[str, Value]]) -> str:
    """``{"": top-level keys, "dist.auth": {...}}`` as TOML text, tables in the given order."""
    lines: list[str] = []
    for name, keys in tables.items():
        if name:
            if lines:
                lines.append("")
            lines.append(f"[{name}]")
        lines.extend(f"{key} = {value(item)}" for key, item in keys.items())
    return "\n".join(lines) + "\n"
