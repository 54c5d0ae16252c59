"""Time the verification suite (``torchkiln verify``) against the importable torch.

The CPU suite has a budget of 90 s on a 2-core machine; the tests never time anything, this script does.
Each run is a fresh ``python -m torchkiln verify --report <tmp>``; the wall time and the suite's per-area
time (from summary.json) are recorded. Prints a table of medians and writes every sample to
bench/results/verify-<UTC time>.json (or --results), atomically.

    python bench/verify_bench.py --repeat 3            # also: nox -s bench -- --only verify
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 90.0


def run_once(extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="verify-bench-") as tmp:
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "torchkiln", "verify", "--report", tmp, *extra],
            capture_output=True,
            text=True,
            check=False,
            cwd=ROOT,
        )
        wall = time.monotonic() - start
        summary_path = Path(tmp) / "summary.json"
        if not summary_path.exists():
            raise SystemExit(
                f"verify wrote no summary (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
            )
        summary = json.loads(summary_path.read_text())
    return {
        "wall_s": round(wall, 2),
        "suite_s": summary["duration_s"],
        "exit": proc.returncode,
        "totals": summary["totals"],
        "area_s": summary["area_durations_s"],
        "torch": summary["environment"].get("torch_version"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs (default 3)")
    parser.add_argument("--results", type=Path, default=None, help="results JSON (default bench/results/...)")
    parser.add_argument("verify_args", nargs="*", help="arguments for torchkiln verify (after --)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    samples = []
    for i in range(args.repeat):
        sample = run_once(args.verify_args)
        samples.append(sample)
        print(
            f"run {i + 1}/{args.repeat}: {sample['wall_s']:.1f} s wall, suite {sample['suite_s']:.1f} s, "
            f"exit {sample['exit']}, {sample['totals']}",
            flush=True,
        )
    wall = statistics.median(s["wall_s"] for s in samples)
    areas = {a: statistics.median(s["area_s"].get(a, 0.0) for s in samples) for a in samples[0]["area_s"]}
    print(f"\nverify suite, torch {samples[0]['torch']}, {os.cpu_count()} CPUs, {args.repeat} runs")
    print(f"{'area':<20}{'median s':>10}")
    for area, seconds in areas.items():
        print(f"{area:<20}{seconds:>10.1f}")
    print(
        f"{'wall (median)':<20}{wall:>10.1f}   budget {BUDGET_S:.0f} s: {'within' if wall <= BUDGET_S else 'OVER'}"
    )
    now = dt.datetime.now(dt.timezone.utc)
    results = args.results or ROOT / "bench" / "results" / f"verify-{now:%Y%m%dT%H%M%SZ}.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": "verify-suite",
        "utc": now.isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "args": args.verify_args,
        "budget_s": BUDGET_S,
        "median_wall_s": wall,
        "median_area_s": areas,
        "samples": samples,
    }
    tmp = results.with_name(f".{results.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, results)
    print(f"results: {results}")
    return 0 if all(s["exit"] == 0 for s in samples) else 1


if __name__ == "__main__":
    sys.exit(main())
