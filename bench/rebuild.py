"""Cached rebuilds of a tree shaped like torchvision (issue 15): by hand beside torchkiln, in one run.

The tree is tests/data/vision_like (44 translation units in two extensions, headers from the build venv's
torch, an in-tree build/, a version.py rewritten by every build, not a git checkout), built as torchvision
(``--only torchvision --source-dir torchvision=<copy>``) with a recipe whose local label is ``+cpu``, so the
CPU torch 2.13.0+cpu wheel of the package index satisfies its ``torchvision:install-torch`` step. The
post-build check is skipped (``--skip-checks``): it installs a wheel named torchvision, and this tree's wheel
is kiln_vision_like.

Rows, all in one run, on one machine, with ``MAX_JOBS`` the same everywhere:

* by hand (the floor): ``python -m build --wheel --no-isolation`` in a venv holding torch and the build
  tools, with the same ccache variables; cold, then warm (a fresh copy of the tree at the same path);
* torchkiln cold (empty local cache and empty Redis: fills both), no-op (the same command again), ``--force``;
* torchkiln warm local, same path (a fresh work directory and tree copy, the local cache warm);
* torchkiln warm remote, same path (fresh work directory, an empty local cache, Redis warm);
* a second builder at another path (its tree and work directory side by side elsewhere), warm local, and
  warm remote with an empty local cache;
* a new machine: another path, warm remote, and both the local cache and the environment store empty.

Every torchkiln row but the last shares one environment store (``--env-store``, empty before the cold
build), as the builds of one machine do: a fresh work directory gets its venvs from it.

Each torchkiln row records its wall time, its compile step's time (``torchvision:wheel``), the time of the
steps around the compile (those that ran or were reused from the store), the cache's hits, and the wheel's sha256 (a rebuild of unchanged sources must give
the same bytes). Results: bench/results/rebuild-<UTC time>.json (or ``--results``) and a table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))

from run import RedisServer, console, require, tool_path, torchkiln_build, wheel_by_hand  # noqa: E402 - after the path set-up

from torchkiln import cache  # noqa: E402
from torchkiln.process.environ import base_environment  # noqa: E402
from torchkiln.recipe.model import CacheSpec  # noqa: E402

VISION = ROOT / "tests" / "data" / "vision_like"
BASE_RECIPE = ROOT / "tests" / "data" / "ext-cpu-test.toml"
BUILD_TOOLS = ["torch==2.13.0", "build", "wheel", "setuptools>=77.0.3", "ninja", "numpy"]
FEATURES_OFF = "\n[torchvision.features]\npng = false\njpeg = false\nwebp = false\n"


def fresh_tree(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(VISION, path, ignore=shutil.ignore_patterns("build", "*.egg-info", "version.py"))
    return path


def by_hand(root: Path, jobs: int) -> list[dict[str, Any]]:
    """The floor: the same tree built by hand with the same cache, cold then warm (a fresh copy)."""
    venv = root / "venv"
    subprocess.run(["python3.11", "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *BUILD_TOOLS], check=True
    )
    config = cache.resolve_cache(CacheSpec(kind="ccache"), dir=root / "ccache", basedir=root)
    environ = {**base_environment(os.environ), "PATH": f"{venv / 'bin'}{os.pathsep}{tool_path()}"}
    rows = []
    for name in ("by hand cold", "by hand warm (fresh copy, same path)"):
        tree = fresh_tree(root / "vision")
        session = cache.open_session(config, environ)
        extra = {"MAX_JOBS": str(jobs), "BUILD_VERSION": "0.28.0+cpu"}
        seconds, stats = wheel_by_hand(str(venv / "bin" / "python"), tree, session, extra)
        rows.append(row(name, seconds, compile_s=seconds, stats=stats.as_dict() if stats else None))
    return rows


def hits_text(stats: dict[str, Any] | None) -> str:
    """``hits/objects`` of a row's cache statistics, ``-`` for a run that compiled nothing."""
    if not stats:
        return "-"
    return f"{stats.get('hits')}/{(stats.get('hits') or 0) + (stats.get('misses') or 0)}"


def row(name: str, seconds: float, **fields: Any) -> dict[str, Any]:
    found = {"name": name, "seconds": round(seconds, 3), **fields}
    console.print(
        f"  {name:<48} {seconds:8.2f} s  hits {hits_text(found.get('stats'))}  {fields.get('ran', '')}"
    )
    return found


class Torchkiln:
    """``torchkiln build`` of a tree as torchvision, one row per call."""

    def __init__(self, scratch: Path, redis_url: str, jobs: int) -> None:
        self.scratch = scratch
        self.jobs = jobs
        self.local = scratch / "recipe-local.toml"
        self.remote = scratch / "recipe-remote.toml"
        text = BASE_RECIPE.read_text().replace('name = "ext-cpu-test"', 'name = "bench-vision-like"')
        self.local.write_text(text + FEATURES_OFF)
        with_remote = text.replace('kind = "ccache"', f'kind = "ccache"\nremote = "{redis_url}"')
        self.remote.write_text(with_remote + FEATURES_OFF)

    def build(
        self,
        name: str,
        builder: Path,
        cache_dir: Path,
        *,
        remote: bool,
        force: bool = False,
        env_store: str = "envs",
    ) -> dict[str, Any]:
        recipe = self.remote if remote else self.local
        argv = [str(recipe), "--only", "torchvision"]
        argv += ["--source-dir", f"torchvision={builder / 'vision'}", "--workdir", str(builder / "work")]
        argv += ["--dist", str(builder / "dist"), "--jobs", str(self.jobs), "--cache", "ccache"]
        argv += ["--cache-dir", str(cache_dir), "--skip-checks", *(["--force"] if force else [])]
        argv += ["--env-store", str(self.scratch / env_store)]
        env = {**os.environ, "PATH": tool_path()}
        seconds, manifest = torchkiln_build(name, argv, env, builder / "dist")
        steps = {s["name"]: s for s in manifest["steps"]}
        ran = [n for n, s in steps.items() if s["status"] == "ran"]
        reused = [n for n, s in steps.items() if s["status"] == "reused"]
        compile_s = steps["torchvision:wheel"]["duration_s"] if "torchvision:wheel" in ran else 0.0
        around = sum(
            s["duration_s"] or 0.0 for n, s in steps.items() if n in ran + reused and n != "torchvision:wheel"
        )
        return row(
            name,
            seconds,
            compile_s=round(compile_s, 3),
            around_compile_s=round(around, 3),
            ran=ran,
            reused=reused,
            steps={n: {"status": s["status"], "seconds": s["duration_s"]} for n, s in steps.items()},
            stats=manifest.get("cache"),
            wheel_sha256=manifest["wheels"][0]["sha256"],
        )


def fresh_builder(path: Path) -> Path:
    for part in ("work", "dist"):
        shutil.rmtree(path / part, ignore_errors=True)
    fresh_tree(path / "vision")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="MAX_JOBS for every build (2)")
    parser.add_argument("--scratch", type=Path, default=None, help="where the trees and caches go")
    parser.add_argument("--results", type=Path, default=None, help="results JSON (bench/results/...)")
    args = parser.parse_args(argv)
    require("ccache", "redis-server", "ninja", "python3.11")
    scratch = Path(tempfile.mkdtemp(prefix="kiln-rebuild-", dir=args.scratch))
    started = dt.datetime.now(dt.timezone.utc)
    rows: list[dict[str, Any]] = []
    (scratch / "redis").mkdir()
    redis = RedisServer(scratch / "redis")
    try:
        console.print("[bold]by hand[/bold] (the floor)")
        rows += by_hand(scratch / "hand", args.jobs)
        kiln = Torchkiln(scratch, redis.url, args.jobs)
        a = fresh_builder(scratch / "a")
        console.print("[bold]torchkiln[/bold], builder A")
        rows.append(kiln.build("torchkiln cold (fills local + Redis)", a, scratch / "cache-a", remote=True))
        rows.append(kiln.build("torchkiln no-op", a, scratch / "cache-a", remote=True))
        rows.append(kiln.build("torchkiln --force", a, scratch / "cache-a", remote=True, force=True))
        rows.append(kiln.build("torchkiln no-op after --force", a, scratch / "cache-a", remote=True))
        rows.append(
            kiln.build(
                "torchkiln warm local, fresh workdir, same path",
                fresh_builder(a),
                scratch / "cache-a",
                remote=False,
            )
        )
        rows.append(
            kiln.build(
                "torchkiln warm remote, empty local, same path",
                fresh_builder(a),
                scratch / "cache-b",
                remote=True,
            )
        )
        b = fresh_builder(scratch / "elsewhere" / "deeper" / "b")
        rows.append(
            kiln.build("second builder, other path, warm local", b, scratch / "cache-a", remote=False)
        )
        c = fresh_builder(scratch / "x" / "c")
        rows.append(
            kiln.build("second builder, other path, warm remote", c, scratch / "cache-c", remote=True)
        )
        d = fresh_builder(scratch / "y" / "d")
        rows.append(
            kiln.build(
                "new machine: other path, warm remote, empty local cache, empty env store",
                d,
                scratch / "cache-d",
                remote=True,
                env_store="envs-new-machine",
            )
        )
    finally:
        redis.stop()
    floor = next(r["seconds"] for r in rows if r["name"].startswith("by hand warm"))
    for r in rows:
        r["ratio_to_floor"] = round(r["seconds"] / floor, 2)
    results = {
        "benchmark": "rebuild",
        "started": started.isoformat(timespec="seconds"),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "jobs": args.jobs,
        "tree": "tests/data/vision_like (44 translation units, 2 extensions)",
        "command": " ".join(["python", "bench/rebuild.py", *(argv if argv is not None else sys.argv[1:])]),
        "rows": rows,
    }
    out = args.results or ROOT / "bench" / "results" / f"rebuild-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    table = Table("run", "wall (s)", "x floor", "compile (s)", "around (s)", "hits", "wheel", title="rebuild")
    for r in rows:
        table.add_row(
            r["name"],
            f"{r['seconds']:.1f}",
            f"{r['ratio_to_floor']:.2f}",
            str(r.get("compile_s", "-")),
            str(r.get("around_compile_s", "-")),
            hits_text(r.get("stats")),
            str(r.get("wheel_sha256", "-"))[:12],
        )
    console.print(table)
    console.print(f"results: {out}")
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
