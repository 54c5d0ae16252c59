"""What ``import torch`` / ``import torchvision`` really load, against what is installed.

verify judges the package Python imports. A distribution's RECORD lists the files pip installed; a copy of the
package earlier on ``sys.path`` (a ``PYTHONPATH`` entry, a source tree in the working directory, an overlay)
is what runs instead, and its extension modules may need what the installed copy does not (a ``_C.so`` built
against ``libpng16.so.16``). :func:`find` says which package directory an import loads (the module itself
when it is imported already, else the path finder's answer, without importing it) and whether it is the
installed distribution's; :func:`as_distribution` presents an imported copy that is not the installed one as
a distribution (its files as its RECORD, the installed one's metadata: what it declares), so the linkage
check reads the files that really load. Standard library only.
"""

from __future__ import annotations

import csv
import importlib.machinery
import importlib.metadata
import io
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Distribution = importlib.metadata.Distribution


@dataclass(frozen=True)
class Imported:
    """``project``'s package as ``import`` finds it (``package``: its directory, None when nothing is
    importable) and as its installed distribution has it (``installed``: None when no distribution lists
    it); ``entry``: the ``sys.path`` entry the import finds it through, and how that entry came to be there."""

    project: str
    package: Path | None
    installed: Path | None
    entry: str = ""

    @property
    def shadowed(self) -> bool:
        """The import loads another copy than the installed distribution's."""
        if self.package is None or self.installed is None:
            return False
        return self.package.resolve() != self.installed.resolve()

    def message(self) -> str:
        """What runs instead of the installed copy, and why (a failure's message; its cause after ``cause: ``)."""
        return (
            f"import {self.project} loads {self.package}, not the installed distribution's copy at "
            f"{self.installed}; cause: {self.project} is shadowed by {self.entry}: the checks judge the imported "
            f"copy, which is not the wheel that was installed\n"
            f"fix: remove that copy from the import path (or install the wheel whose files it should be)"
        )


def _entry(package: Path, path: Sequence[str], environ: Mapping[str, str]) -> str:
    """The sys.path entry holding ``package``, and where the entry comes from."""
    parent = package.parent.resolve()
    python_path = [Path(p or ".").resolve() for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for entry in path:
        where = Path(entry or ".").resolve()
        if where != parent:
            continue
        if where in python_path:
            return f"the sys.path entry {where}, from PYTHONPATH"
        if not entry or where == Path.cwd().resolve():
            return f"the working directory {where} (sys.path's first entry: a source tree?)"
        return f"the sys.path entry {where} (a .pth file, a site directory or an overlay)"
    return f"{parent} (the module's own directory)"


def _package_dir(project: str, path: Sequence[str]) -> Path | None:
    module = sys.modules.get(project)
    where = getattr(module, "__file__", None) if module is not None else None
    if where:
        return Path(where).parent
    spec = importlib.machinery.PathFinder.find_spec(project, list(path))
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin).parent if spec.origin else None


def find(
    project: str,
    dist: Distribution | None,
    path: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Imported:
    """Where ``import project`` loads it from (the imported module's own file when it is imported already),
    against the installed distribution ``dist``'s copy."""
    path = list(sys.path if path is None else path)
    package = _package_dir(project, path)
    installed = None
    if dist is not None:
        candidate = Path(str(dist.locate_file(project)))
        installed = candidate if candidate.is_dir() else None
    entry = _entry(package, path, os.environ if environ is None else environ) if package is not None else ""
    return Imported(project, package, installed, entry)


class ImportedCopy(Distribution):
    """The imported copy of a package as a distribution: its files (walked, not a RECORD: a shadowing copy
    has none) as the RECORD, relative to the directory above the package as site-packages' are; the installed
    distribution's METADATA otherwise (name, version, Requires-Dist: what the copy stands in for)."""

    def __init__(self, imported: Imported, installed: Distribution) -> None:
        assert imported.package is not None
        self._package = imported.package.resolve()
        self._root = self._package.parent
        self._installed = installed

    def read_text(self, filename: str) -> str | None:
        if filename == "RECORD":
            out = io.StringIO()
            writer = csv.writer(out)
            for file in sorted(self._package.rglob("*")):
                if file.is_file():
                    writer.writerow([file.relative_to(self._root).as_posix(), "", ""])
            return out.getvalue()
        return self._installed.read_text(filename)

    def locate_file(self, path: Any) -> Path:
        return self._root / str(path)


def as_distribution(imported: Imported, installed: Distribution) -> Distribution:
    """``installed`` when the import loads its copy, else the imported copy (:class:`ImportedCopy`)."""
    return ImportedCopy(imported, installed) if imported.shadowed else installed
