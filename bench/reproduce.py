"""`torchkiln reproduce` on upstream's real torchvision 0.21.0 tree (issue 35 item 6's measurement).

The build is tests/test_vision_build.py's: Debian's orig tarball of torchvision 0.21.0 (tests/kit/realtrees.py),
``torchkiln build tests/data/vision-0.21-cu124-test.toml --only torchvision --torch <torch 2.6.0+cu124
wheel> --source-dir torchvision=<tree>``, in a bubblewrap sandbox with the CUDA 12.4 toolkit from NVIDIA's
wheels at /usr/local/cuda-12.4 (tests/kit/cudakit.py). Why CUDA and not a CPU build: torchvision 0.21 pairs with
torch 2.6 only, the index's torch 2.6.0 for cp311 x86_64 is the cu124 build (no CPU wheel of 2.6.0), and a
CPU recipe refuses a CUDA torch. The tree is extracted fresh (a tree without git: its SOURCE_DATE_EPOCH came
from its newest file's mtime, which the extraction set), built once, then reproduced from the manifest:
``torchkiln reproduce dist/manifest.json`` (a copy of the tree at another path, a fresh work directory, no
compiler cache, the recorded epoch). Both in the same sandbox, one after the other.

    python bench/reproduce.py --out bench/results    # results: bench/results/reproduce-<UTC time>.json

Prints the reproduce verdict (same sha256, or the members and ELF sections that differ) and the times.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))

from kit import cudakit, realtrees  # noqa: E402 - after the path set-up

RECIPE = ROOT / "tests" / "data" / "vision-0.21-cu124-test.toml"


def run(argv: list[str], env: dict[str, str], log: Path) -> tuple[int, float]:
    started = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(argv, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    return done.returncode, round(time.monotonic() - started, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument(
        "--root", type=Path, default=None, help="scratch directory (default: a temporary one)"
    )
    parser.add_argument("--jobs", default="2")
    args = parser.parse_args()
    root = Path(args.root or tempfile.mkdtemp(prefix="kiln-reproduce-bench-")).absolute()
    root.mkdir(parents=True, exist_ok=True)
    cache = realtrees.cache_dir()
    tree = realtrees.extract(realtrees.VISION_0_21_0, root / "tree")
    torch = realtrees.pypi_wheel("torch==2.6.0", python_version="3.11")
    sandbox = cudakit.sandbox(cudakit.toolkit())
    env = {**os.environ, "TORCHKILN_ENV_STORE": str(cache / "envs")}
    kiln = [sys.executable, "-m", "torchkiln"]
    build = [*kiln, "build", str(RECIPE), "--only", "torchvision", "--torch", str(torch)]
    build += ["--source-dir", f"torchvision={tree}", "--jobs", args.jobs]
    build += ["--workdir", str(root / "work"), "--dist", str(root / "dist"), "--skip-postcheck"]
    build += ["--cache", "ccache", "--cache-dir", str(cache / "ccache-vision-0.21")]
    load = Path("/proc/loadavg").read_text().split()[:3]
    rc, build_s = run([*sandbox, *build], env, root / "build.log")
    if rc != 0:
        print((root / "build.log").read_text()[-4000:], file=sys.stderr)
        return rc
    reproduce = [*kiln, "reproduce", str(root / "dist" / "manifest.json"), "--workdir", str(root / "again")]
    reproduce += ["--jobs", args.jobs]
    rc, reproduce_s = run([*sandbox, *reproduce], env, root / "reproduce.log")
    report = json.loads((root / "again" / "reproduce.json").read_text()) if rc in (0, 1) else None
    result = {
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "loadavg_before": load,
        "build_s": build_s,
        "reproduce_s": reproduce_s,
        "reproduce_exit": rc,
        "report": report,
        "logs": str(root),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"reproduce-{dt.datetime.now(dt.timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print((root / "reproduce.log").read_text()[-6000:])
    print(f"build {build_s} s, reproduce {reproduce_s} s (exit {rc}); {out}")
    if args.root is None and rc == 0:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if rc in (0, 1) else rc


if __name__ == "__main__":
    sys.exit(main())
