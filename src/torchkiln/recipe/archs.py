"""CUDA architecture lists: what a recipe's ``arch_list`` compiles to, and what runs on which device.

``TORCH_CUDA_ARCH_LIST`` entries like ``8.6`` or ``12.0+PTX`` become the strings that
``torch.cuda.get_arch_list()`` reports (``sm_86``, ``sm_120``, ``compute_120``). Whether a device can run
the build follows NVIDIA's compatibility rules, which is what decides "no kernel image is available":

* a cubin ``sm_XY`` runs on devices of the same major version X with minor >= Y;
* an arch-specific cubin ``sm_XYa`` runs only on capability X.Y exactly;
* a family cubin ``sm_XYf`` runs on the same major with minor >= Y;
* PTX ``compute_XY`` is JIT-compiled for any device of capability >= X.Y (``compute_XYa`` only on X.Y).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

ENTRY_RE = re.compile(r"^(?P<major>\d{1,2})\.(?P<minor>\d)(?P<suffix>[af]?)(?P<ptx>\+PTX)?$")
COMPILED_RE = re.compile(r"^(?P<kind>sm|compute)_(?P<major>\d{1,2}?)(?P<minor>\d)(?P<suffix>[af]?)$")


def expected_arch_list(entries: Iterable[str]) -> set[str]:
    """Recipe arch_list entries -> the set ``torch.cuda.get_arch_list()`` must report.

    >>> sorted(expected_arch_list(["7.5", "12.0+PTX"]))
    ['compute_120', 'sm_120', 'sm_75']
    """
    out: set[str] = set()
    for entry in entries:
        match = ENTRY_RE.match(entry)
        if match is None:
            raise ValueError(f"arch list entry {entry!r} is not like 8.0, 9.0a or 12.0+PTX")
        code = f"{match['major']}{match['minor']}{match['suffix']}"
        out.add(f"sm_{code}")
        if match["ptx"]:
            out.add(f"compute_{code}")
    return out


def parse_compiled(arch: str) -> tuple[str, int, int, str]:
    """'sm_86' -> ('sm', 8, 6, ''); 'compute_120' -> ('compute', 12, 0, ''); 'sm_90a' -> ('sm', 9, 0, 'a')."""
    match = COMPILED_RE.match(arch)
    if match is None:
        raise ValueError(f"{arch!r} is not a compiled architecture like sm_86 or compute_120")
    return match["kind"], int(match["major"]), int(match["minor"]), match["suffix"]


def runs_on(arch: str, capability: tuple[int, int]) -> bool:
    """Whether code compiled for ``arch`` (a get_arch_list() entry) runs on a device of ``capability``."""
    kind, major, minor, suffix = parse_compiled(arch)
    dev_major, dev_minor = capability
    if suffix == "a":
        return (dev_major, dev_minor) == (major, minor)
    if kind == "compute":
        return (dev_major, dev_minor) >= (major, minor)
    return dev_major == major and dev_minor >= minor


def covering(arch_list: Iterable[str], capability: tuple[int, int]) -> list[str]:
    """The entries of ``arch_list`` that can run on ``capability`` (empty: no kernel image for it)."""
    return [arch for arch in arch_list if runs_on(arch, capability)]
