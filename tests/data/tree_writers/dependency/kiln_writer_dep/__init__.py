"""A build dependency that writes into the tree it is used to build (tests/test_tree_writers.py): its
``setuptools.finalize_distribution_options`` entry point runs whenever setuptools starts in the build venv (the
compile step), its ``kiln_writer_dep.pth`` whenever a Python of the check venv starts (``checks:venv``: a
post-build hook). Each writes when ``KILN_WRITE`` names it (tests/data/tree_writers/README.md)."""

import os
import sys


def write(writer):
    if writer not in os.environ.get("KILN_WRITE", "").split(","):
        return
    target = os.environ["KILN_WRITE_TO"]
    try:
        if target.endswith("/"):
            os.makedirs(target, exist_ok=True)
            target += f"{writer}.out"
        with open(target, "a") as handle:
            handle.write(f"\n# written by {writer}\n")
    except OSError as exc:
        print(f"kiln-write: {writer} could not write {target}: {exc}", file=sys.stderr, flush=True)
        os._exit(3)


def finalize(dist):
    """setuptools' finalize_distribution_options hook: runs as setuptools starts (the issue's writer)."""
    write("entry-point")


def at_start():
    """From kiln_writer_dep.pth: in the check venv only (a post-build hook)."""
    if os.path.basename(sys.prefix) == "check-venv":
        write("post-build")
