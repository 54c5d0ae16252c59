"""How build settings spell true and false: one table for everything that reads them.

CMake's summary (``USE_CUDA : ON``), ``torch.__config__.show()``'s Build settings (``USE_CUDA=1``) and recipe
flags (``USE_KINETO = false``) all spell booleans their own way; the configure watcher and the verification
suite must agree on what each spelling means. Standard library only.
"""

from __future__ import annotations

TRUE_SPELLINGS = frozenset({"1", "ON", "TRUE", "YES", "Y"})
FALSE_SPELLINGS = frozenset({"0", "OFF", "FALSE", "NO", "N", ""})


def truth(value: str | None) -> bool | None:
    """True or False for a known spelling (any case, surrounding blanks ignored); None for anything else
    (absent, or a value such as ``mkl`` that is not a boolean)."""
    if value is None:
        return None
    upper = value.strip().upper()
    if upper in TRUE_SPELLINGS:
        return True
    if upper in FALSE_SPELLINGS:
        return False
    return None


def flag_value(value: bool | int | str) -> str:
    """A recipe flag as the build's environment gets it: booleans become ``1``/``0``."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)
