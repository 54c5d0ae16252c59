"""Wheels into dist/, atomically.

Wheels are built into ``<workdir>/wheelhouse/<project>`` and reach ``dist/`` only after the whole build and
its checks succeeded (the publish step), each copied under a temporary name inside dist/ and renamed
(:mod:`torchkiln.atomic`): a reader of dist/ sees either the complete wheel or none, also when the build is
interrupted half-way. Temporaries a killed process (SIGKILL cannot be caught) left are removed at the start
of the next build.
"""

from __future__ import annotations

from pathlib import Path

from . import atomic, wheelfile
from .atomic import PARTIAL_MARK, clean_partials

__all__ = ["PARTIAL_MARK", "clean_partials", "publish", "remove_superseded", "wheels_in"]


def publish(source: Path, dist: Path) -> Path:
    """Copy ``source`` into ``dist`` under its own name, atomically (temporary name, fsync, os.replace).
    A copy, not a hard link: a later build rewriting the wheelhouse file must never touch dist/."""
    dist.mkdir(parents=True, exist_ok=True)
    return atomic.copy(source, dist / source.name)


def wheels_in(directory: Path) -> list[Path]:
    """The wheels in ``directory`` (sorted by name; none when it does not exist)."""
    return wheelfile.find([directory])


def remove_superseded(dist: Path, published: list[Path]) -> list[Path]:
    """Remove other wheels of the distributions just published (an older version or local label).

    dist/ then holds one wheel per project, the one the manifest lists: installing "the wheels in dist/"
    can never pick up a stale build. Wheels of other distributions are left alone.
    """
    names = {name.project for p in published if (name := wheelfile.parse(p.name)) is not None}
    keep = {p.name for p in published}
    removed = []
    for path in wheels_in(dist):
        name = wheelfile.parse(path.name)
        if path.name not in keep and name is not None and name.project in names:
            path.unlink()
            removed.append(path)
    return removed
