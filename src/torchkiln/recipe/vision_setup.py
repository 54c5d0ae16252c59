"""What torchvision's setup.py prints when it leaves out a part of ``[torchvision.features]``
(``data/vision_setup.toml``, each line quoted from upstream's setup.py with its place).

torchvision's setup.py warns ("Building torchvision without PNG support") and builds on without the part,
whatever ``TORCHVISION_USE_PNG`` asked for. The build's watcher reads these lines from the compile step's
output (:mod:`torchkiln.build.vision_watch`); the table sits here, below the build and the plan, so a host
check can read what each part needs from the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from torchkiln.shipped import shipped_toml


@dataclass(frozen=True)
class VisionPart:
    """One ``[torchvision.features]`` part as setup.py treats it."""

    feature: str  # the recipe's name: torchvision.features.<feature>
    env: str  # the TORCHVISION_USE_<NAME> variable setup.py reads
    dropped: tuple[str, ...]  # what setup.py prints when it builds without the part
    needs: str  # what setup.py looks for


@cache
def vision_parts() -> dict[str, VisionPart]:
    """feature -> its part, from the data file shipped with torchkiln."""
    return {
        name: VisionPart(name, row["env"], tuple(row["dropped"]), row["needs"])
        for name, row in shipped_toml("vision_setup.toml").items()
    }
