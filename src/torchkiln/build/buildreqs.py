"""Install a branch's own build requirements into the build virtualenv, in one resolution.

Build requirements differ per branch and can conflict: torch 2.13 wants ``setuptools>=77.0.3`` while older
torchvision ``setup.py`` files import ``pkg_resources``, which setuptools 81 removed. Both projects share one
build env, so their requirements (``requirements-build.txt``, ``requirements.txt``, ``[build-system].requires``,
plus what the recipe adds) are resolved together, and a conflict is reported here, before anything compiles,
naming the requirements and the file each came from.

The resolution is pip's own, for real, in the build venv: ``pip install --dry-run --report`` against the
configured index, then exactly what it resolved is installed (``name==version``, ``--no-deps``), so what is
installed is what was resolved.

What was resolved is also written as a pip constraints file (``--constraints FILE``, ``name==version`` per
line, then each requirement torchkiln derived itself, e.g. ``setuptools<81`` with its reason): every later
pip call of the build (torchvision's torch install, the post-build check) runs with it, so nothing a later
install pulls in can undo this resolution (torch's ``setuptools>=77.0.3`` upgrading the ``setuptools<81`` an
older torchvision needs), and the manifest keeps it. The resolution ignores what the venv already holds, so
every requirement is pinned, also one the venv's own packages happened to satisfy.

Run as ``python -m torchkiln.build.buildreqs --python VENV_PYTHON --source torch=DIR [--source torchvision=DIR]
[--extra REQ ...] [--constraints FILE]`` (the plan's ``build-env:deps`` step).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from torchkiln.errors import EXIT_USAGE
from torchkiln.files import atomic
from torchkiln.process import runner
from torchkiln.shipped import tomllib

REQUIREMENT_FILES = ("requirements-build.txt", "requirements.txt")
# Requirements in those files that are not build requirements of the wheel (test and lint tools).
_PKG_RESOURCES = re.compile(r"^\s*(import pkg_resources|from pkg_resources import)", re.MULTILINE)
PKG_RESOURCES_SETUPTOOLS = "setuptools<81"  # setuptools 81 removed pkg_resources


@dataclass(frozen=True)
class Req:
    requirement: Requirement
    origin: str  # "torchvision: setup.py imports pkg_resources", "torch: requirements.txt", ...
    derived: bool = False  # torchkiln's own rule, not a file of the project: written as a constraint too


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
        reqs.append(
            Req(
                Requirement(PKG_RESOURCES_SETUPTOOLS),
                f"{project}: setup.py imports pkg_resources",
                derived=True,
            )
        )
    # The projects themselves are built here, never installed from an index.
    return [r for r in reqs if canonicalize_name(r.requirement.name) not in {"torch", "torchvision"}]


@dataclass(frozen=True)
class Resolution:
    """pip's answer for a set of requirements: what it would install, or why it cannot."""

    install: list[tuple[str, str]]  # (name, version), in pip's order
    error: str | None  # pip's explanation when the requirements cannot be resolved together


# pip's words for "these requirements cannot be satisfied together".
_CONFLICT = re.compile(
    r"ResolutionImpossible|conflict|Could not find a version that satisfies", re.IGNORECASE
)


def resolve(python: str, reqs: list[Req]) -> Resolution:
    """Resolve ``reqs`` with the build venv's pip (``--dry-run --report``): nothing is installed.

    ``--ignore-installed``: the resolution is of the requirements alone, not of what the venv happens to
    hold. Without it pip reports only what it would change, so a requirement the venv's own packages already
    satisfy (a Python 3.11 venv's setuptools 65.5 for ``setuptools<81``) got no pin, and a later install
    (torch's ``setuptools>=77.0.3``) upgraded it past the bound (issue 20 item 5)."""
    with tempfile.TemporaryDirectory(prefix="torchkiln-buildreqs-") as tmp:
        report = Path(tmp) / "report.json"
        argv = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
        argv += ["--report", str(report)]
        try:
            done = runner.run([*argv, "--", *(str(r.requirement) for r in reqs)])
        except runner.ProcessError as exc:
            return Resolution([], f"--python {python}: {exc}")
        if not done.ok:
            return Resolution([], done.stderr.strip() or done.failure())
        data = json.loads(report.read_text(encoding="utf-8"))
    install = [(item["metadata"]["name"], item["metadata"]["version"]) for item in data.get("install", [])]
    return Resolution(install, None)


def involved(error: str, reqs: list[Req]) -> list[Req]:
    """The requirements pip's error names (all of them when it names none we know)."""
    words = {canonicalize_name(w) for w in re.findall(r"[A-Za-z0-9][A-Za-z0-9._-]*", error)}
    named = [r for r in reqs if canonicalize_name(r.requirement.name) in words]
    return named or reqs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m torchkiln.build.buildreqs", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--python", required=True, help="the build venv's python")
    parser.add_argument("--source", action="append", default=[], metavar="PROJECT=DIR")
    parser.add_argument(
        "--extra", action="append", default=[], metavar="REQ", help="requirement the recipe adds"
    )
    parser.add_argument("--dry-run", action="store_true", help="print what would be installed")
    parser.add_argument(
        "--constraints", type=Path, default=None, metavar="FILE", help="write the resolved pins here"
    )
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

    for r in reqs:
        print(f"  {r.requirement}  <- {r.origin}")
    if not reqs:
        if args.constraints is not None and not args.dry_run:
            write_constraints(args.constraints, [])
        return 0
    resolution = resolve(args.python, reqs)
    if resolution.error is not None:
        conflict = bool(_CONFLICT.search(resolution.error))
        head = "build requirements conflict" if conflict else "build requirements cannot be resolved"
        print(f"{head} (nothing was compiled):", file=sys.stderr)
        for r in involved(resolution.error, reqs):
            print(f"  {r.requirement}  <- {r.origin}", file=sys.stderr)
        print("pip says:", file=sys.stderr)
        for line in resolution.error.splitlines():
            if not line.startswith("WARNING:"):  # pip's notes about index locations
                print(f"  {line}", file=sys.stderr)
        return 1
    pins = [f"{name}=={version}" for name, version in resolution.install]
    for pin in pins:
        print(f"  resolved {pin}")
    if args.dry_run:
        return 0
    if pins:
        done = runner.run([args.python, "-m", "pip", "install", "--no-deps", "--", *pins])
        sys.stdout.write(done.stdout)
        if not done.ok:
            sys.stderr.write(done.stderr)
            return done.returncode or 1
    if args.constraints is not None:
        write_constraints(args.constraints, pins, derived_constraints(reqs))
        print(f"  constraints for every later pip call: {args.constraints}")
    return 0


def derived_constraints(reqs: list[Req]) -> list[str]:
    """torchkiln's own requirements (a ``setuptools<81`` for a setup.py importing pkg_resources) as
    constraint lines with their reason: written whatever pip resolved, so they hold for every later pip call
    even where no pin names the package. A constraint is a name and a version range (pip refuses extras)."""
    out = []
    for r in reqs:
        if r.derived and r.requirement.specifier and not r.requirement.extras:
            marker = f"; {r.requirement.marker}" if r.requirement.marker else ""
            out.append(f"{r.requirement.name}{r.requirement.specifier}{marker}  # {r.origin}")
    return sorted(set(out))


CONSTRAINTS_HEADER = (
    "# torchkiln: the build env's resolution (build-env:deps); every later pip call keeps it\n"
)


def write_constraints(path: Path, pins: list[str], derived: list[str] | None = None) -> None:
    """The pins, then the derived constraints, as a pip constraints file, complete or absent (temp + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = sorted(pins, key=str.lower) + list(derived or [])
    atomic.write_text(path, CONSTRAINTS_HEADER + "".join(f"{line}\n" for line in lines))


def read_constraints(path: Path) -> list[str]:
    """The constraints of a file written by :func:`write_constraints`, without comments ([] when there is
    none): the pins, then the derived ranges."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    lines = (line.split(" #", 1)[0].strip() for line in text.splitlines() if not line.startswith("#"))
    return [line for line in lines if line]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
