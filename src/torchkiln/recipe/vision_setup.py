"""What torchvision's setup.py prints when it leaves out a part of ``[torchvision.features]``
(``data/vision_setup.toml``, each line quoted from upstream's setup.py with its place).

torchvision's setup.py warns ("Building torchvision without PNG support") and builds on without the part,
whatever ``TORCHVISION_USE_PNG`` asked for. The build's watcher reads these lines from the compile step's
output (:mod:`torchkiln.build.vision_watch`); the table sits here, below the build and the plan, so a host
check can read what each part needs from the same rows.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import cache
from importlib import resources

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (Ubuntu 22.04): the same parser, as a package
    import tomli as tomllib


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
    text = resources.files("torchkiln").joinpath("data/vision_setup.toml").read_text("utf-8")
    return {
        name: VisionPart(name, row["env"], tuple(row["dropped"]), row["needs"])
        for name, row in tomllib.loads(text).items()
    }
