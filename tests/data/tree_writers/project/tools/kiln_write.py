"""Write where tests/test_tree_writers.py says: when ``KILN_WRITE`` (comma-separated) names the writer, append a
line to ``KILN_WRITE_TO`` (ending in ``/``: a directory, the writer's own ``<writer>.out`` in it). A write that
fails ends the process (a writer that cannot write says so)."""

import os
import sys


def write(writer: str) -> None:
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
