"""One recipe, several Pythons (issue 23): what the second and third Python cost against the first.

The tree is tests/data/pythons_project (torch's shape: setup.py runs CMake and ninja in the in-tree build/, a
core library whose units never see a Python include directory, one module unit that includes Python.h), with
``--heavy`` more core units added to the copy, each as heavy as a small ATen unit (``<regex>``, ``<iostream>``
and a few containers instantiated: about a second of cc1plus each), so that the compile, not CMake's configure,
is what a Python costs. It is built as torch (``--only torch --source-dir torch=<copy>``, ``--skip-checks``)
with the test recipe (tests/data/ext-cpu-test.toml) and ``python.versions``.

Rows, one run each, in one work directory with one ccache directory (empty at the start) and one environment
store:

* ``versions = ["3.11"]``: the first Python, cold;
* ``["3.11", "3.12"]``: the first Python's steps are unchanged (skipped), the second's run: its compile step's
  time against the first's, and its hits (this run's cache statistics are the second Python's alone);
* ``["3.11", "3.12", "3.13"]``: the same for the third;
* a fresh work directory, an empty cache, the three Pythons in one build: three wheels, one manifest.

The Pythons come from PATH, else pyenv (``~/.pyenv/versions/3.1X*``). Results: bench/results/pythons-<UTC
time>.json (or ``--results``) and a table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
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

from run import console, require, tool_path, torchkiln_build  # noqa: E402 - after the path set-up

TREE = ROOT / "tests" / "data" / "pythons_project"
BASE_RECIPE = ROOT / "tests" / "data" / "ext-cpu-test.toml"
PYTHONS = ("3.11", "3.12", "3.13")
HEAVY_UNIT = """#include <iostream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

// A bench unit: no Python.h, about a second of cc1plus (what a small ATen unit costs).
std::size_t kiln_heavy_{n}(const std::string& text) {{
  std::regex words("[a-z]+{n}");
  std::unordered_map<std::string, std::vector<int>> seen;
  std::map<int, std::string> order;
  std::ostringstream out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), words); it != std::sregex_iterator(); ++it) {{
    seen[it->str()].push_back({n});
    order[static_cast<int>(it->position())] = it->str();
  }}
  for (const auto& [at, word] : order) out << at << word;
  std::cout << out.str().size();
  return seen.size() + order.size();
}}
"""


def python_dir(scratch: Path, versions: tuple[str, ...]) -> Path:
    """A directory with ``python3.X`` for each version: from PATH when it runs, else pyenv's (whose shims on
    PATH run nothing unless pyenv is told which)."""
    bindir = scratch / "pythons"
    bindir.mkdir()
    for version in versions:
        exe = f"python{version}"
        found = [p for p in [shutil.which(exe)] if p]
        found += sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}*/bin/{exe}")))
        usable = [
            p for p in found if subprocess.run([p, "-c", "import venv"], capture_output=True).returncode == 0
        ]
        if not usable:
            raise SystemExit(f"bench: no {exe} on PATH or under ~/.pyenv/versions")
        (bindir / exe).symlink_to(usable[0])
    return bindir


def fresh_tree(path: Path, heavy: int) -> Path:
    shutil.copytree(TREE, path)
    for n in range(heavy):
        (path / "csrc" / f"core_heavy_{n:02d}.cpp").write_text(HEAVY_UNIT.format(n=n))
    return path


def recipe(scratch: Path, versions: tuple[str, ...]) -> Path:
    listed = ", ".join(f'"{v}"' for v in versions)
    text = BASE_RECIPE.read_text().replace('version = "3.11"', f"versions = [{listed}]")
    path = scratch / f"bench-pythons-{len(versions)}.toml"
    path.write_text(text.replace('name = "ext-cpu-test"', f'name = "bench-pythons-{len(versions)}"'))
    return path


def build(
    name: str, scratch: Path, builder: Path, versions: tuple[str, ...], jobs: int, env: dict[str, str]
) -> dict[str, Any]:
    """One ``torchkiln build`` of the tree for ``versions``; the row: wall time, each Python's compile step
    (status and seconds), this run's cache statistics, the wheels the manifest lists."""
    argv = [str(recipe(scratch, versions)), "--only", "torch"]
    argv += ["--source-dir", f"torch={builder / 'src'}", "--workdir", str(builder / "work")]
    argv += ["--dist", str(builder / "dist"), "--jobs", str(jobs), "--cache", "ccache", "--skip-checks"]
    argv += ["--no-preflight"]  # the stand-in is no torch tree (no version.txt, no OpenBLAS)
    argv += ["--cache-dir", str(builder / "ccache"), "--env-store", str(scratch / "envs")]
    seconds, manifest = torchkiln_build(name, argv, env, builder / "dist")
    steps = {s["name"]: s for s in manifest["steps"]}
    compiles = {
        v: {"status": steps[n]["status"], "seconds": steps[n]["duration_s"]}
        for v, n in ((v, "torch:wheel" if v == versions[0] else f"torch:wheel@{v}") for v in versions)
    }
    stats = manifest.get("cache") or {}
    found = {
        "name": name,
        "pythons": list(versions),
        "seconds": round(seconds, 3),
        "compile": compiles,
        "hits": stats.get("hits"),
        "misses": stats.get("misses"),
        "wheels": [{"name": w["name"], "python": w["python"]} for w in manifest["wheels"]],
    }
    shown = ", ".join(f"{v} {c['status']} {c['seconds']:.1f} s" for v, c in compiles.items())
    console.print(
        f"  {name:<40} {seconds:7.1f} s  hits {found['hits']}/{(found['hits'] or 0) + (found['misses'] or 0)}  {shown}"
    )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="MAX_JOBS for every build (2)")
    parser.add_argument("--heavy", type=int, default=24, help="heavy core units added to the tree (24)")
    parser.add_argument("--scratch", type=Path, default=None, help="where the trees and caches go")
    parser.add_argument("--results", type=Path, default=None, help="results JSON (bench/results/...)")
    args = parser.parse_args(argv)
    require("ccache", "ninja", "cmake")
    scratch = Path(tempfile.mkdtemp(prefix="kiln-pythons-", dir=args.scratch))
    started = dt.datetime.now(dt.UTC)
    env = {**os.environ, "PATH": f"{python_dir(scratch, PYTHONS)}{os.pathsep}{tool_path()}"}
    a = scratch / "a"
    fresh_tree(a / "src", args.heavy)
    rows = []
    console.print("[bold]one Python more per run[/bold] (one work directory, one cache)")
    for n in range(1, len(PYTHONS) + 1):
        rows.append(build(f"python.versions = {list(PYTHONS[:n])}", scratch, a, PYTHONS[:n], args.jobs, env))
    first = rows[0]["compile"][PYTHONS[0]]["seconds"]
    for r, python in zip(rows[1:], PYTHONS[1:], strict=True):
        r["fraction_of_first"] = round(r["compile"][python]["seconds"] / first, 3)
    console.print("[bold]the three Pythons in one build[/bold] (fresh work directory, empty cache)")
    b = scratch / "b"
    fresh_tree(b / "src", args.heavy)
    rows.append(build("one build, three Pythons, cold", scratch, b, PYTHONS, args.jobs, env))
    one = rows[-1]["compile"]
    rows[-1]["fraction_of_first"] = {
        p: round(one[p]["seconds"] / one[PYTHONS[0]]["seconds"], 3) for p in PYTHONS[1:]
    }
    results = {
        "benchmark": "pythons",
        "started": started.isoformat(timespec="seconds"),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "jobs": args.jobs,
        "tree": f"tests/data/pythons_project + {args.heavy} heavy core units ({6 + args.heavy} units without "
        "Python.h, 1 with)",
        "command": " ".join(["python", "bench/pythons.py", *(argv if argv is not None else sys.argv[1:])]),
        "rows": rows,
    }
    out = args.results or ROOT / "bench" / "results" / f"pythons-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    table = Table("run", "wall (s)", *(f"{p} compile (s)" for p in PYTHONS), "hits", title="pythons")
    for r in rows:
        cells = [
            f"{r['compile'][p]['seconds']:.1f} ({r['compile'][p]['status']})" if p in r["compile"] else "-"
            for p in PYTHONS
        ]
        table.add_row(
            r["name"], f"{r['seconds']:.1f}", *cells, f"{r['hits']}/{(r['hits'] or 0) + (r['misses'] or 0)}"
        )
    console.print(table)
    console.print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
