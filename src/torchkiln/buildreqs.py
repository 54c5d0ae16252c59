"""Install a branch's own build requirements into the build virtualenv, in one resolution.

Build requirements differ per branch and can conflict: torch 2.13 wants ``setuptools>=77.0.3`` while older
torchvision ``setup.py`` files import ``pkg_resources``, which setuptools 81 removed. Both projects share one
build env, so their requirements (``requirements-build.txt``, ``requirements.txt``, ``[build-system].requires``,
plus what the recipe adds) are resolved together, and a conflict is reported here, before anything compiles,
naming the requirement and the file it came from.

Run as ``python -m torchkiln.buildreqs --python VENV_PYTHON --source torch=DIR [--source torchvision=DIR]
[--extra REQ ...]`` (the plan's ``build-env:deps`` step).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from .errors import EXIT_USAGE

REQUIREMENT_FILES = ("requirements-build.txt", "requirements.txt")
# Requirements in those files that are not build requirements of the wheel (test and lint tools).
_PKG_RESOURCES = re.compile(r"^\s*(import pkg_resources|from pkg_resources import)", re.MULTILINE)
PKG_RESOURCES_SETUPTOOLS = "setuptools<81"  # setuptools 81 removed pkg_resources


@dataclass(frozen=True)
class Req:
    requirement: Requirement
    origin: str  # "torchvision: setup.py imports pkg_resources", "torch: requirements.txt", ...


def _read_requirement_file(path: Path, origin: str, seen: set[Path]) -> list[Req]:
    if path in seen or not path.is_file():
        return []
    seen.add(path)
    out: list[Req] = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-r ", "--requirement ")):
            out += _read_requirement_file(path.parent / line.split(None, 1)[1], origin, seen)
            continue
        if line.startswith("-"):
            continue  # pip options (--extra-index-url, -e .): not requirements
        try:
            out.append(Req(Requirement(line), f"{origin}: {path.name}"))
        except InvalidRequirement:
            continue
    return out


def collect(project: str, source: Path) -> list[Req]:
    """Build requirements a checkout declares, with where each came from."""
    reqs: list[Req] = []
    seen: set[Path] = set()
    for name in REQUIREMENT_FILES:
        reqs += _read_requirement_file(source / name, project, seen)
    pyproject = source / "pyproject.toml"
    if pyproject.is_file():
        try:
            data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError:
            data = {}
        for line in data.get("build-system", {}).get("requires", []):
            try:
                reqs.append(Req(Requirement(line), f"{project}: pyproject.toml [build-system].requires"))
            except InvalidRequirement:
                continue
    setup_py = source / "setup.py"
    if setup_py.is_file() and _PKG_RESOURCES.search(setup_py.read_text(encoding="utf-8", errors="replace")):
        reqs.append(Req(Requirement(PKG_RESOURCES_SETUPTOOLS), f"{project}: setup.py imports pkg_resources"))
    # The projects themselves are built here, never installed from an index.
    return [r for r in reqs if canonicalize_name(r.requirement.name) not in {"torch", "torchvision"}]


def conflicts(reqs: list[Req]) -> list[str]:
    """Pairs of requirements on the same package whose version ranges cannot both hold.

    A cheap pre-check over the candidate versions named in the specifiers themselves; pip's resolver remains
    the final word (its error is reported too).
    """
    by_name: dict[str, list[Req]] = {}
    for r in reqs:
        if r.requirement.marker is None or r.requirement.marker.evaluate():
            by_name.setdefault(canonicalize_name(r.requirement.name), []).append(r)
    problems = []
    for name, group in sorted(by_name.items()):
        combined = SpecifierSet()
        for r in group:
            combined &= r.requirement.specifier
        candidates = {s.version for r in group for s in r.requirement.specifier}
        if not candidates:
            continue
        probes = _probes(candidates)
        if not any(combined.contains(v, prereleases=True) for v in probes):
            listed = "; ".join(f"{r.requirement} ({r.origin})" for r in group if r.requirement.specifier)
            problems.append(f"{name}: no version satisfies all of: {listed}")
    return problems


def _probes(versions: set[str]) -> list[str]:
    """Versions around each bound: the bound itself and just above/below it."""
    from packaging.version import InvalidVersion, Version

    probes: list[str] = []
    for text in versions:
        try:
            v = Version(text.rstrip(".*"))
        except InvalidVersion:
            continue
        major, minor, micro = (list(v.release) + [0, 0])[:3]
        probes += [str(v), f"{major}.{minor}.{micro + 1}", f"{major}.{minor + 1}", f"{major + 1}"]
        if micro:
            probes.append(f"{major}.{minor}.{micro - 1}")
        elif minor:
            probes.append(f"{major}.{minor - 1}.999")
        elif major:
            probes.append(f"{major - 1}.999")
    return probes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchkiln.buildreqs", description=__doc__.split("\n")[0])
    parser.add_argument("--python", required=True, help="the build venv's python")
    parser.add_argument("--source", action="append", default=[], metavar="PROJECT=DIR")
    parser.add_argument(
        "--extra", action="append", default=[], metavar="REQ", help="requirement the recipe adds"
    )
    parser.add_argument("--dry-run", action="store_true", help="print what would be installed")
    args = parser.parse_args(argv)

    reqs: list[Req] = []
    for item in args.source:
        project, sep, directory = item.partition("=")
        if not sep or not Path(directory).is_dir():
            print(
                f"buildreqs: --source {item}: expected PROJECT=DIR with an existing directory",
                file=sys.stderr,
            )
            return EXIT_USAGE
        reqs += collect(project, Path(directory))
    for extra in args.extra:
        try:
            reqs.append(Req(Requirement(extra), "recipe"))
        except InvalidRequirement as exc:
            print(f"buildreqs: --extra {extra!r}: {exc}", file=sys.stderr)
            return EXIT_USAGE

    found = conflicts(reqs)
    if found:
        print("build requirements conflict (nothing was compiled):", file=sys.stderr)
        for line in found:
            print(f"  {line}", file=sys.stderr)
        return 1
    for r in reqs:
        print(f"  {r.requirement}  <- {r.origin}")
    if args.dry_run or not reqs:
        return 0
    argv_pip = [args.python, "-m", "pip", "install", *(str(r.requirement) for r in reqs)]
    result = subprocess.run(argv_pip, check=False, capture_output=True, text=True)
    sys.stdout.write(result.stdout)
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        if "ResolutionImpossible" in result.stderr or "conflict" in result.stderr.lower():
            print(
                "build requirements conflict (pip could not resolve them; nothing was compiled)",
                file=sys.stderr,
            )
        return result.returncode
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
