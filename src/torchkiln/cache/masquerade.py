"""ccache in front of a build that does not put it there itself: a directory of compiler names that run ccache.

torch.utils.cpp_extension before torch 2.12 (data/compat.toml ``cpp_extension_launcher``) runs ``$CXX``
(else ``c++``) as it is, so torchvision's compiles against such a torch would miss the recipe's cache;
2.12 and later prepend ccache themselves (``_wrap_compiler``). ccache run through a link named like a
compiler ("masquerade") runs the next program of that name on PATH, skipping itself: this directory, first
on the compile step's PATH, puts ccache in front of ``cc``, ``c++``, ``gcc``, ``g++`` (and build.gcc's
``gcc-N``, ``g++-N``) without changing what ``$CC``/``$CXX`` say. cpp_extension's own checks, which resolve
and run ``$CXX`` (``-v``, ``-dumpfullversion``), still reach the real compiler through ccache. (sccache has
no such mode: with sccache those compiles stay uncached on torch < 2.12, as upstream's own builds do.)

Run as ``python -m torchkiln.cache.masquerade --tool ccache --dir DIR NAME...`` (the plan's
``torchvision:launchers`` step). The directory is made beside its place and renamed into it: it is whole or
absent.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from torchkiln.errors import EXIT_FAILURE, EXIT_USAGE

TOOLS = ("ccache",)  # the tools with a masquerade mode
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9+._-]{0,63}")


def compiler_names(gcc: int | None) -> tuple[str, ...]:
    """The names a build may invoke its compilers by: the defaults, and build.gcc's versioned drivers."""
    versioned = (f"gcc-{gcc}", f"g++-{gcc}") if gcc is not None else ()
    return ("cc", "c++", "gcc", "g++", *versioned)


def make(tool: Path, directory: Path, names: Sequence[str]) -> None:
    """``directory`` holding one link to ``tool`` per name, replacing what was there."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".torchkiln-partial-{directory.name}."))
    try:
        for name in names:
            (tmp / name).symlink_to(tool)
        if directory.is_dir() and not directory.is_symlink():
            shutil.rmtree(directory)
        os.replace(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchkiln.cache.masquerade")
    parser.add_argument("--tool", required=True, choices=TOOLS)
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("names", nargs="+")
    args = parser.parse_args(argv)
    bad = [n for n in args.names if not NAME_RE.fullmatch(n)]
    if bad:
        print(f"masquerade: {bad[0]!r} is not a compiler name (valid: e.g. g++-13)", file=sys.stderr)
        return EXIT_USAGE
    found = shutil.which(args.tool)
    if found is None:
        print(f"masquerade: no {args.tool} on PATH (the recipe's cache.kind needs it)", file=sys.stderr)
        return EXIT_FAILURE
    make(Path(os.path.realpath(found)), args.dir, args.names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
