"""The post-build check's venv, cloned from the build venv minus the build's tools (issue 38).

The check proves that the built wheels install with pip and import, in a venv that holds what they need at
run time and nothing of the build. It used to make that venv from nothing (``python -m venv``: ensurepip,
seconds) and pip then installed torch into it again (the 0.2 to 2.5 GB wheel unpacked once more: most of
the check's time, about seven times the cached compile of torchvision). The build venv already holds that
torch and its requirements. So the ``checks:venv`` step runs this module: the build venv is cloned (hard
links: :func:`torchkiln.build.envstore.clone_tree`, relocated to its new path), then, run by the clone's own
python, :mod:`torchkiln.build.venvprune` removes every distribution the ``--keep`` ones (torch) do not need
at run time (cmake, ninja, build, wheel, setuptools, ...) and the ``--drop`` ones (the wheels the check
installs: pip would take an installed distribution of the same version as already there, whatever its
content). The check then installs the wheels into it as before, their missing requirements from the index,
and imports them.

A warm clone (:mod:`torchkiln.build.warmcheck`) may come pruned already, for the wheels' requirements as
predicted before they were built (:mod:`torchkiln.build.earlycheck`); its mark lists what that removed. The
prune here runs again with the built wheels' own requirements, and when one of them is among what was
removed (venvprune's :data:`MISPREDICTED`), the build venv is cloned again and pruned as if no clone had been
warmed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from torchkiln.process import runner

from .envstore import full_clone
from .warmcheck import take

PRUNE = Path(__file__).resolve().parent / "venvprune.py"
MISPREDICTED = (
    3  # venvprune's exit status when a predicted prune removed what the wheels need (its own constant)
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, required=True, help="the build venv")
    parser.add_argument(
        "--python", required=True, help="makes the venv afresh where the plan made no build venv"
    )
    parser.add_argument("--keep", action="append", default=[], metavar="NAME")
    parser.add_argument("--drop", action="append", default=[], metavar="NAME")
    parser.add_argument(
        "--requirements-of",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="a wheelhouse: what its wheels require is kept (the check installs them)",
    )
    parser.add_argument(
        "--warm",
        type=Path,
        default=None,
        help="a clone of the build venv made before this step, while the compile ran where one ran (build.warmcheck): taken when whole",
    )
    parser.add_argument("target", type=Path, help="the check venv (made)")
    args = parser.parse_args(argv)
    source, target = args.source.absolute(), args.target.absolute()
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.exists() or target.is_symlink():
        target.unlink()
    removed = take(args.warm.absolute(), source, target) if args.warm is not None else None
    if removed is not None:
        print(f"checkvenv: {target} is the clone of {source} made before this step (build.warmcheck)")
        done = _prune(target, args, removed)
        if done != MISPREDICTED:
            return done
        print(f"checkvenv: {target} cloned again (the warm clone's prune removed what the wheels need)")
        shutil.rmtree(target)
    made = _clone(source, target, args.python)
    return made or _prune(target, args, ())


def _clone(source: Path, target: Path, python: str) -> int:
    """``target`` a clone of the build venv ``source``; a venv of its own where the plan made none."""
    if (source / "bin" / "python").exists():  # a linked venv is cloned from its store entry
        full_clone(source, target, str(target))
        return 0
    # a plan without the build venv's steps (a library caller's subset of one): a venv of its own
    made = runner.run([python, "-m", "venv", "--", str(target)], capture=False)
    return 0 if made.ok else made.returncode or 1


def _prune(target: Path, args: argparse.Namespace, removed: tuple[str, ...]) -> int:
    """The check venv pruned (torchkiln.build.venvprune) for the wheels in ``--requirements-of``;
    ``removed``: what a predicted prune took out of it before (:data:`MISPREDICTED` when one is needed)."""
    argv = [str(target / "bin" / "python"), str(PRUNE)]
    argv += [f"--keep={name}" for name in args.keep] + [f"--drop={name}" for name in args.drop]
    wheels = sorted(w for d in args.requirements_of if d.is_dir() for w in d.glob("*.whl"))
    argv += [f"--keep-for={wheel}" for wheel in wheels]
    argv += [f"--removed-before={name}" for name in removed]
    # the clone's python, with the standard library and pip only: a separate process, as the check's
    done = runner.run(argv, capture=False)
    return 0 if done.ok else done.returncode or 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
