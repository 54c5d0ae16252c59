"""Leave in a venv only what its runtime needs: run with the venv's own python (issue 38).

The post-build check's venv is a clone of the build venv (:mod:`torchkiln.build.checkvenv`). This removes
from it every distribution that is not needed at run time by ``--keep`` (torch: what torchvision is built
against) or by the wheels the check installs (``--keep-for WHEEL``: their METADATA's requirements), and so is
one of the build's tools (cmake, ninja, build, wheel, setuptools, ...): the distributions required by the
kept ones, with their markers and extras evaluated by this interpreter, stay; pip stays (the check installs
with it); the ``--drop`` ones (the wheels the check installs, which pip would otherwise take as already
installed) go whatever needs them.

Removal is what ``pip uninstall`` does, in this process: every path the distribution's RECORD lists (its
scripts under ``bin/`` included), the ``.pyc`` of each listed ``.py``, its ``.dist-info``, then the
directories left empty. pip's own uninstall took a second interpreter with pip's whole machinery: half of
the check venv's cost in a fresh work directory (issue 38). A distribution without a RECORD (installed by
something other than a wheel installer) is still handed to pip. Nothing outside the venv is ever removed.

Standard library and pip's vendored ``packaging`` only: it runs in a venv where torchkiln is not installed,
as :mod:`torchkiln.build.postcheck` does.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import email.parser
import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from pip._vendor.packaging.requirements import InvalidRequirement, Requirement
from pip._vendor.packaging.utils import canonicalize_name

ALWAYS = ("pip",)
MISPREDICTED = 3  # the exit status when --removed-before names what the roots need (the venv is cloned again)


def installed() -> dict[str, importlib.metadata.Distribution]:
    """The distributions of this venv (not of the base interpreter), by canonical name."""
    prefix = os.path.realpath(sys.prefix)
    found: dict[str, importlib.metadata.Distribution] = {}
    for dist in importlib.metadata.distributions():
        location = Path(str(dist.locate_file(""))).resolve()
        name = dist.metadata["Name"]
        if name and location.is_relative_to(prefix):
            found.setdefault(canonicalize_name(name), dist)
    return found


def needed(
    roots: list[str], dists: dict[str, importlib.metadata.Distribution], missing: set[str] | None = None
) -> set[str]:
    """``roots`` and everything they require here, transitively (each requirement's extras followed); what
    they require that is not here is added to ``missing``."""
    keep: set[tuple[str, str]] = set()
    stack = [(canonicalize_name(r), "") for r in roots]
    while stack:
        name, extra = stack.pop()
        if name not in dists and missing is not None:
            missing.add(name)
        if (name, extra) in keep or name not in dists:
            continue
        keep.add((name, extra))
        for line in dists[name].requires or []:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if req.marker is not None and not req.marker.evaluate({"extra": extra}):
                continue
            child = canonicalize_name(req.name)
            stack += [(child, "")] + [(child, canonicalize_name(e)) for e in sorted(req.extras)]
    return {name for name, _ in keep}


def wheel_requirements(wheel: Path) -> list[str]:
    """The names a wheel requires here (its METADATA's ``Requires-Dist``, markers evaluated, no extra)."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        metadata = email.parser.BytesParser().parsebytes(archive.read(name))
    found = []
    for line in metadata.get_all("Requires-Dist") or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            found.append(req.name)
    return found


def _pyc(path: str) -> list[str]:
    """The bytecode of a ``.py`` file (any interpreter's, any optimisation level)."""
    directory, name = os.path.split(path)
    cache = os.path.join(directory, "__pycache__")
    stem = name[: -len(".py")] + "."
    try:
        return [
            os.path.join(cache, n) for n in os.listdir(cache) if n.startswith(stem) and n.endswith(".pyc")
        ]
    except OSError:
        return []


def remove_recorded(dist: importlib.metadata.Distribution, prefix: str) -> bool:
    """The distribution's files, as its RECORD lists them, removed; False (nothing removed) without a RECORD.
    A listed path that is not under ``prefix`` (the venv, resolved) is left alone. Strings, not paths: cmake's
    RECORD alone is four thousand lines."""
    text = dist.read_text("RECORD")
    if text is None:
        return False
    base = os.path.realpath(str(dist.locate_file("")))  # prefix is resolved too
    inside = prefix.rstrip(os.sep) + os.sep
    parents: set[str] = set()
    for row in csv.reader(text.splitlines()):
        if not row or not row[0]:
            continue
        path = os.path.normpath(os.path.join(base, row[0]))
        if not path.startswith(inside):
            continue
        directory, name = os.path.split(path)
        if name == "RECORD" and directory.endswith(".dist-info"):
            shutil.rmtree(directory, ignore_errors=True)  # what else the installer wrote there too
        for each in [path, *(_pyc(path) if name.endswith(".py") else [])]:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.unlink(each)
        parents.add(directory)
    for directory in sorted(parents, key=lambda d: d.count(os.sep), reverse=True):  # deepest first
        _remove_empty(directory, inside)
    return True


def _remove_empty(directory: str, inside: str) -> None:
    """``directory`` and its parents below ``inside`` (the venv), each while it is empty (or holds only an
    empty ``__pycache__``)."""
    while directory.startswith(inside):
        with contextlib.suppress(OSError):
            os.rmdir(os.path.join(directory, "__pycache__"))
        try:
            os.rmdir(directory)
        except FileNotFoundError:
            pass
        except OSError:  # not empty: what is left is another distribution's
            return
        directory = os.path.dirname(directory)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="append", default=[], metavar="NAME")
    parser.add_argument("--keep-for", action="append", default=[], metavar="WHEEL", type=Path)
    parser.add_argument("--drop", action="append", default=[], metavar="NAME")
    parser.add_argument(
        "--removed-before",
        action="append",
        default=[],
        metavar="NAME",
        help=f"removed from this venv by a prune that predicted what is kept: exit {MISPREDICTED} if one is needed",
    )
    args = parser.parse_args(argv)
    dists = installed()
    roots = [*args.keep, *(name for wheel in args.keep_for for name in wheel_requirements(wheel))]
    missing: set[str] = set()
    keep = needed(roots, dists, missing) | set(ALWAYS)
    wrong = sorted(missing & {canonicalize_name(n) for n in args.removed_before})
    if wrong:
        print(f"venvprune: the earlier prune removed what is needed: {', '.join(wrong)}")
        return MISPREDICTED
    keep -= {canonicalize_name(n) for n in args.drop}
    remove = sorted(dists[name].metadata["Name"] for name in set(dists) - keep)
    print(f"venvprune: kept {', '.join(sorted(keep & set(dists))) or 'nothing'}")
    if not remove:
        return 0
    print(f"venvprune: removing {', '.join(remove)}")
    prefix = os.path.realpath(sys.prefix)
    unrecorded = [name for name in remove if not remove_recorded(dists[canonicalize_name(name)], prefix)]
    if not unrecorded:
        return 0
    done = subprocess.run(
        [sys.executable, "-m", "pip", "uninstall", "--yes", "--quiet", *unrecorded], check=False
    )
    return done.returncode


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
