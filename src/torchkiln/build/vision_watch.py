"""The torchvision watcher: read what torchvision's setup.py prints while the build runs and stop it before
it compiles a wheel without a part the recipe asks for.

torchvision's setup.py looks for each optional part (libpng, libjpeg, libwebp, nvjpeg, ffmpeg, the GPU video
decoder) while it lists its extensions, and when one is missing it warns ("Building torchvision without PNG
support") and builds on without it, whatever ``TORCHVISION_USE_PNG`` says. Those lines come before setuptools
starts its commands (``running bdist_wheel``, ``running build_ext``, ...): the watcher collects every part the
step asked for that setup.py dropped, and gives its verdict at the first of those commands, before anything
is compiled. The lines are data (:mod:`torchkiln.recipe.vision_setup`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from torchkiln.recipe.spelling import truth
from torchkiln.recipe.vision_setup import VisionPart, vision_parts

from .watch import Contradiction

# setuptools' first output once setup() runs (after setup.py listed its extensions): "running egg_info",
# "running bdist_wheel", ...; build_ext's "building 'torchvision._C' extension"; and ninja's first "[1/N]" (the
# compiler's output goes straight to the terminal, a piped Python's may come later).
BUILD_BEGINS = re.compile(r"^(running [a-z_]+$|building '[\w.]+' extension$|\[\d+/\d+\] )")


class VisionWatcher:
    """Feed it the compile step's output line by line; :meth:`feed` returns None until setuptools starts its
    commands after setup.py dropped a part the step asked for, then the contradictions once."""

    what = "stopped before compiling, torchvision's setup.py builds without what the recipe asks for"

    def __init__(self, wanted: Iterable[VisionPart]) -> None:
        self.wanted = tuple(wanted)
        self._found: dict[str, str] = {}  # feature -> the line that said it was dropped
        self.contradictions: list[Contradiction] | None = None

    @classmethod
    def for_step(cls, env: Mapping[str, str]) -> VisionWatcher:
        """The parts the step asks for: ``TORCHVISION_USE_<NAME>`` set true in its environment."""
        return cls(part for part in vision_parts().values() if truth(env.get(part.env)) is True)

    def feed(self, line: str) -> list[Contradiction] | None:
        if self.contradictions is not None or not self.wanted:
            return None
        text = line.strip()
        for part in self.wanted:
            if part.feature not in self._found and any(dropped in text for dropped in part.dropped):
                self._found[part.feature] = text
        if self._found and BUILD_BEGINS.match(text):
            return self._finish()
        return None

    def close(self) -> list[Contradiction] | None:
        """End of output: what setup.py dropped, if the commands never started."""
        if self.contradictions is None and self._found:
            return self._finish()
        return None

    def _finish(self) -> list[Contradiction]:
        self.contradictions = [
            Contradiction(
                f"torchvision.features.{part.feature}",
                "true",
                "false",
                f"setup.py found no {part.needs}",
                self._found[part.feature],
                source="setup.py",
            )
            for part in self.wanted
            if part.feature in self._found
        ]
        return self.contradictions
