"""torchkiln benchmarks (``nox -s bench``): the compiler cache and the no-op rebuild, then the verify suite.

Compiler cache - tests/data/cache_ext (a torch C++ extension built with torch.utils.cpp_extension, the
path torchvision's build takes) with ``python -m build --wheel --no-isolation`` and the variables of
:mod:`torchkiln.cache`, each scenario ``--repeat`` times, a fresh checkout path every run:

* ``no cache``: kind none (the compile time without any cache);
* ``cold``: ccache, empty local cache, empty Redis (fills both);
* ``warm local``: the local cache of the cold run, no remote;
* ``warm remote``: an empty local cache, the Redis the cold run filled (a second builder).

No-op rebuild - ``torchkiln build`` (what ``nox -s build-wheel`` runs) on tests/data/ext_project standing in
for torch, run again with nothing changed.

Prints a table of medians and ratios and writes every sample to a JSON results file
(bench/results/bench-<UTC time>.json unless --results). Then runs bench/verify_bench.py when it exists.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from torchkiln import cache  # noqa: E402 - after the path set-up for a plain `python bench/run.py`
from torchkiln.process.environ import base_environment  # noqa: E402
from torchkiln.recipe.model import CacheSpec  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))
from kit.ext_recipe import ext_recipe_text  # noqa: E402 - the test extension's recipe (it stands in for torch)

CACHE_EXT = ROOT / "tests" / "data" / "cache_ext"
NOOP_EXT = ROOT / "tests" / "data" / "ext_project"
console = Console(highlight=False)


def tool_path() -> str:
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])


def require(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t, path=tool_path()) is None]
    if missing:
        raise SystemExit(f"bench: {', '.join(missing)} not installed (apt-get install ccache redis-server)")


def settle() -> None:
    """Before a timed row: what the previous rows and this row's set-up wrote (a cold build's objects, a
    removed work directory, a fresh copy of the tree) written back now, not under the row's own timing."""
    os.sync()


def torchkiln_build(
    name: str, argv: list[str], env: dict[str, str], dist: Path, prefix: Sequence[str] = ()
) -> tuple[float, dict[str, Any]]:
    """``python -m torchkiln build <argv>`` (run by ``prefix``: a sandbox): its wall time and the manifest it
    published in ``dist``; a failed build stops the benchmark with the end of its output. Settled first."""
    settle()
    start = time.perf_counter()
    done = subprocess.run(
        [*prefix, sys.executable, "-m", "torchkiln", "build", *argv],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"bench: {name} failed:\n{(done.stdout + done.stderr)[-4000:]}")
    return seconds, json.loads((dist / "manifest.json").read_text())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """A throw-away redis-server on a loopback port (nothing persisted)."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--dir", str(workdir)]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise SystemExit("bench: redis-server did not start") from None
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def build_cache_ext(
    checkout: Path, config: cache.CacheConfig, jobs: int
) -> tuple[float, cache.CacheStats | None]:
    """One wheel build of the cache test extension; (seconds, cache statistics)."""
    shutil.copytree(CACHE_EXT, checkout)
    environ = {**base_environment(os.environ), "PATH": tool_path(), "MAX_JOBS": str(jobs)}
    session = cache.open_session(replace(config, basedir=checkout.parent), environ)
    for warning in session.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")
    return wheel_by_hand(sys.executable, checkout, session, {"MAX_JOBS": str(jobs)})


def wheel_by_hand(
    python: str, tree: Path, session: cache.CacheSession, extra_env: dict[str, str]
) -> tuple[float, cache.CacheStats | None]:
    """``python -m build --wheel --no-isolation`` in ``tree`` through ``session``'s compiler cache, as a user
    builds by hand: (seconds, the session's statistics). The session is closed; a failed build ends the bench."""
    start = time.perf_counter()
    done = subprocess.run(
        [python, "-m", "build", "--wheel", "--no-isolation"],
        cwd=tree,
        env={**session.tool_env, **extra_env},
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    stats = session.close()
    if done.returncode != 0:
        raise SystemExit(f"bench: build in {tree} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return seconds, stats


def cache_bench(tool: str, baseline: bool) -> Callable[[int, int, Path], dict[str, list[dict[str, Any]]]]:
    """The cache scenarios for ``tool`` (ccache or sccache); ``baseline`` adds the no-cache build."""

    def bench(repeat: int, jobs: int, scratch: Path) -> dict[str, list[dict[str, Any]]]:
        require(tool, "redis-server", "ninja")
        names = (["no cache"] if baseline else []) + ["cold", "warm local", "warm remote"]
        samples: dict[str, list[dict[str, Any]]] = {name: [] for name in names}

        def record(name: str, seconds: float, stats: cache.CacheStats | None) -> None:
            rate = None if stats is None else stats.hit_rate
            samples[name].append(
                {"seconds": round(seconds, 3), "stats": None if stats is None else stats.as_dict()}
            )
            shown = "-" if rate is None else f"{rate:.0%}"
            console.print(f"  {name:<12} {seconds:7.1f} s  hit rate {shown}")

        for run in range(repeat):
            console.print(f"[bold]{tool} run {run + 1}/{repeat}[/bold]")
            base = scratch / f"{tool}-{run}"
            redis = RedisServer(Path(tempfile.mkdtemp(dir=scratch)))
            try:
                if baseline:
                    none = cache.resolve_cache(CacheSpec(kind="none"), dir=base / "none")
                    record("no cache", *build_cache_ext(base / "n" / "cache_ext", none, jobs))
                cold = cache.resolve_cache(CacheSpec(kind=tool, remote=redis.url), dir=base / "local-a")
                record("cold", *build_cache_ext(base / "a" / "cache_ext", cold, jobs))
                local = cache.resolve_cache(CacheSpec(kind=tool), dir=base / "local-a")
                record("warm local", *build_cache_ext(base / "b" / "cache_ext", local, jobs))
                remote = cache.resolve_cache(CacheSpec(kind=tool, remote=redis.url), dir=base / "local-c")
                record("warm remote", *build_cache_ext(base / "c" / "cache_ext", remote, jobs))
            finally:
                redis.stop()
            shutil.rmtree(base, ignore_errors=True)
        return samples

    return bench


def noop_bench(repeat: int, jobs: int, scratch: Path) -> dict[str, list[dict[str, Any]]]:
    """``torchkiln build`` twice+ on the same inputs: the reruns must skip every step."""
    python = shutil.which("python3.11")
    require("ccache", "ninja")
    if python is None:
        raise SystemExit("bench: python3.11 is required for the no-op rebuild benchmark")
    root = scratch / "noop"
    work = root / "work"
    shutil.copytree(NOOP_EXT, root / "src")
    recipe = root / "bench-noop.toml"
    # the stand-in extension builds against an installed torch: the recipe asks for it among the build venv's
    # requirements (build.requirements, tests/kit/ext_recipe.py); a venv made by hand would be removed (issue 27)
    recipe.write_text(ext_recipe_text())
    argv = [
        sys.executable,
        "-m",
        "torchkiln",
        "build",
        str(recipe),
        "--source-dir",
        f"torch={root / 'src'}",
    ]
    argv += ["--only", "torch", "--workdir", str(work), "--dist", str(root / "dist"), "--jobs", str(jobs)]
    argv += ["--cache", "ccache", "--cache-dir", str(root / "ccache"), "--env-store", str(root / "envs")]
    argv += ["--no-preflight"]  # the stand-in extension is no torch tree (no version.txt, no OpenBLAS)
    env = {**os.environ, "PATH": tool_path()}
    samples: dict[str, list[dict[str, Any]]] = {"build-wheel first": [], "build-wheel no-op": []}
    for name, runs in (("build-wheel first", 1), ("build-wheel no-op", repeat)):
        for _ in range(runs):
            start = time.perf_counter()
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            seconds = time.perf_counter() - start
            if done.returncode != 0:
                raise SystemExit(f"bench: torchkiln build failed:\n{(done.stdout + done.stderr)[-3000:]}")
            summary = next((line.strip() for line in done.stdout.splitlines() if "step(s) ran" in line), "")
            samples[name].append({"seconds": round(seconds, 3), "summary": summary})
            console.print(f"  {name:<18} {seconds:7.1f} s  {summary}")
            if name.endswith("no-op") and "(0 step(s) ran" not in summary:
                console.print("[yellow]warning:[/yellow] the rerun was not a no-op: steps ran again")
    return samples


def summarize(samples: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    medians = {name: statistics.median(s["seconds"] for s in runs) for name, runs in samples.items() if runs}
    reference = medians.get("cold") or medians.get("build-wheel first")
    rows = []
    for name, runs in samples.items():
        if not runs:
            continue
        rates = [
            s["stats"]["hit_rate"] for s in runs if s.get("stats") and s["stats"]["hit_rate"] is not None
        ]
        rows.append(
            {
                "scenario": name,
                "runs": [s["seconds"] for s in runs],
                "median_s": round(medians[name], 3),
                "vs_cold": round(medians[name] / reference, 3) if reference else None,
                "median_hit_rate": statistics.median(rates) if rates else None,
            }
        )
    return rows


def print_table(title: str, rows: list[dict[str, Any]], reference: str) -> None:
    table = Table("scenario", "runs (s)", "median (s)", f"x {reference}", "hit rate", title=title)
    for row in rows:
        rate = row["median_hit_rate"]
        table.add_row(
            row["scenario"],
            " ".join(f"{s:.1f}" for s in row["runs"]),
            f"{row['median_s']:.1f}",
            "-" if row["vs_cold"] is None else f"{row['vs_cold']:.2f}",
            "-" if rate is None else f"{rate:.0%}",
        )
    console.print(table)


def run_verify_bench(repeat: int, extra: list[str]) -> int:
    script = ROOT / "bench" / "verify_bench.py"
    if not script.exists():
        return 0
    console.print("[bold]verify suite benchmark[/bold] (bench/verify_bench.py)")
    argv = [sys.executable, str(script), "--repeat", str(repeat), *(["--", *extra] if extra else [])]
    return subprocess.run(argv, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per scenario (default 3)")
    parser.add_argument("--jobs", type=int, default=2, help="MAX_JOBS of each build (default 2)")
    parser.add_argument(
        "--only",
        choices=("cache", "noop", "verify"),
        action="append",
        help="run only these parts (repeatable)",
    )
    parser.add_argument(
        "--tool",
        choices=("ccache", "sccache"),
        action="append",
        help="cache tool(s) to measure (repeatable; default ccache)",
    )
    parser.add_argument("--results", type=Path, default=None, help="results JSON (default bench/results/...)")
    parser.add_argument("verify_args", nargs="*", help="arguments after -- go to bench/verify_bench.py")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    parts = set(args.only or ("cache", "noop", "verify"))
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    results_path = args.results or ROOT / "bench" / "results" / f"bench-{stamp}.json"
    results: dict[str, Any] = {
        "started": stamp,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "repeat": args.repeat,
        "jobs": args.jobs,
    }
    parts_run: list[tuple[str, str, Callable[[int, int, Path], dict[str, list[dict[str, Any]]]], str]] = []
    if "cache" in parts:
        for index, tool in enumerate(dict.fromkeys(args.tool or ["ccache"])):
            title = f"compiler cache: {tool} (tests/data/cache_ext, 3 C++ TUs)"
            parts_run.append((f"cache_{tool}", title, cache_bench(tool, baseline=index == 0), "cold"))
    if "noop" in parts:
        parts_run.append(("noop", "torchkiln build: no-op rerun", noop_bench, "build-wheel first"))
    with tempfile.TemporaryDirectory(prefix="torchkiln-bench-") as scratch:
        for key, title, bench, reference in parts_run:
            samples = bench(args.repeat, args.jobs, Path(scratch))
            rows = summarize(samples)
            results[key] = {"samples": samples, "summary": rows}
            print_table(title, rows, reference)
    if parts_run:
        results_path.parent.mkdir(parents=True, exist_ok=True)
        partial = results_path.with_suffix(".json.partial")
        partial.write_text(json.dumps(results, indent=2) + "\n")
        os.replace(partial, results_path)
        console.print(f"results: {results_path}")
    return run_verify_bench(args.repeat, args.verify_args) if "verify" in parts else 0


if __name__ == "__main__":
    sys.exit(main())
