"""One recipe, several Pythons (issue 23): what the second and third Python cost against the first.

Two trees (``--tree``):

* ``pythons`` (torch's shape): tests/data/pythons_project (setup.py runs CMake and ninja in the in-tree build/,
  a core library whose units never see a Python include directory, one module unit that includes Python.h),
  with ``--heavy`` more core units added to the copy, each as heavy as a small ATen unit (``<regex>``,
  ``<iostream>`` and a few containers instantiated: about a second of cc1plus each), so that the compile, not
  CMake's configure, is what a Python costs. Built as torch (``--only torch --source-dir torch=<copy>``,
  ``--skip-postcheck``) with the test recipe (tests/data/ext-cpu-test.toml) and ``python.versions``.
* ``torchvision-0.21``: upstream's real torchvision 0.21.0 tree (Debian's orig tarball, tests/kit/realtrees.py)
  against upstream's torch 2.6.0+cu124 for each Python (``--torch torch==2.6.0``), with the recipe
  tests/data/vision-0.21-cu124-test.toml (one arch, the codecs): its C++ ops and codecs through
  cpp_extension and the plan's ccache launchers, its 6 CUDA files through nvcc 12.4 (tests/kit/cudakit.py, bound
  at /usr/local/cuda-12.4 in a bubblewrap sandbox; nvcc's units are not cached: torch 2.6 puts no launcher
  in front of nvcc), then the image extension. Preflight runs (a real tree).
* ``vision_like`` (torchvision's shape): tests/data/vision_like (44 units through torch.utils.cpp_extension
  and ninja, each including ATen headers; two, vision.cpp and io/image.cpp, include torch/extension.h and
  so Python.h), built as torchvision (``--only torchvision``) against upstream's torch 2.13.0 for each Python (``--torch
  torch===2.13.0``: the CUDA 13.0 build on PyPI, the same build for every Python, with the recipe
  recipes/torch-2.13-cu130-py312.toml made CPU-compile-only: no codecs, this host's gcc). Every unit gets
  the Python's own compile flags from setuptools (sysconfig's CFLAGS): CPython 3.11's ``-fwrapv`` is 3.12's
  ``-fno-strict-overflow``, so 3.12 cannot reuse 3.11's objects, and 3.13 can reuse 3.12's.

Rows, one run each, in one work directory with one ccache directory (empty at the start) and one environment
store:

* ``versions = ["3.11"]``: the first Python, cold;
* ``["3.11", "3.12"]``: the first Python's steps are unchanged (skipped), the second's run: its compile step's
  time against the first's, and its hits (this run's cache statistics are the second Python's alone);
* ``["3.11", "3.12", "3.13"]``: the same for the third;
* a fresh work directory, an empty cache, the three Pythons in one build: three wheels, one manifest.

The Pythons come from PATH, else pyenv (``~/.pyenv/versions/3.1X*``). Results: bench/results/pythons-<tree>-<UTC
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from run import console, require, tool_path, torchkiln_build  # noqa: E402 - after the path set-up

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (Ubuntu 22.04): the same parser, as a package
    import tomli as tomllib

TREE = ROOT / "tests" / "data" / "pythons_project"
BASE_RECIPE = ROOT / "tests" / "data" / "ext-cpu-test.toml"
VISION_TREE = ROOT / "tests" / "data" / "vision_like"
VISION_RECIPE = ROOT / "recipes" / "torch-2.13-cu130-py312.toml"
# upstream's CUDA 13.0 build, for every Python (===: never a +cpu local build)
VISION_TORCH = "torch===2.13.0"
REAL_VISION_RECIPE = ROOT / "tests" / "data" / "vision-0.21-cu124-test.toml"
PYTHONS = ("3.11", "3.12", "3.13")
TREES = ("pythons", "vision_like", "torchvision-0.21")
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


@dataclass(frozen=True)
class Tree:
    """A bench tree: how a copy is made, the recipe for some Pythons, the project built and its arguments."""

    name: str
    project: str
    fresh: Callable[[Path], Path]
    recipe: Callable[[Path, tuple[str, ...]], Path]
    args: tuple[str, ...]
    description: str
    prefix: tuple[str, ...] = ()  # what runs the build (a sandbox)


def pythons_tree(heavy: int) -> Tree:
    def fresh(path: Path) -> Path:
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

    # --no-preflight: the stand-in is no torch tree (no version.txt, no OpenBLAS)
    args = ("--only", "torch", "--skip-postcheck", "--no-preflight")
    units = f"{6 + heavy} units without Python.h, 1 with"
    return Tree(
        "pythons", "torch", fresh, recipe, args, f"tests/data/pythons_project + {heavy} heavy ({units})"
    )


def vision_tree() -> Tree:
    def fresh(path: Path) -> Path:
        return Path(shutil.copytree(VISION_TREE, path))

    def recipe(scratch: Path, versions: tuple[str, ...]) -> Path:
        doc = tomllib.loads(VISION_RECIPE.read_text())
        doc["recipe"]["name"] = f"bench-vision-like-{len(versions)}"
        doc["python"] = {"versions": list(versions)}
        doc["torchvision"]["features"] = {part: False for part in ("png", "jpeg", "webp", "nvjpeg")}
        doc["build"]["gcc"] = host_gcc()
        path = scratch / f"bench-vision-like-{len(versions)}.toml"
        path.write_text(tomli_w.dumps(doc))
        return path

    # --no-preflight: no CUDA 13.0 toolkit needed (no CUDA unit), nor MKL; the checks would install the
    # 9 GB of NVIDIA wheels once more
    args = ("--only", "torchvision", "--torch", VISION_TORCH, "--skip-postcheck", "--no-preflight")
    return Tree(
        "vision_like",
        "torchvision",
        fresh,
        recipe,
        args,
        "tests/data/vision_like (44 units, 2 with Python.h)",
    )


def real_vision_tree(scratch: Path) -> Tree:
    sys.path.insert(0, str(ROOT / "tests"))
    from kit import cudakit, realtrees  # noqa: PLC0415 - the tests' helpers: the Debian tarball, CUDA 12.4.1

    extracted = realtrees.extract(realtrees.VISION_0_21_0, scratch / "upstream")

    def fresh(path: Path) -> Path:
        return Path(shutil.copytree(extracted, path, symlinks=True))

    def recipe(scratch: Path, versions: tuple[str, ...]) -> Path:
        doc = tomllib.loads(REAL_VISION_RECIPE.read_text())
        doc["recipe"]["name"] = f"bench-vision-0.21-{len(versions)}"
        doc["python"] = {"versions": list(versions)}
        path = scratch / f"bench-vision-0.21-{len(versions)}.toml"
        path.write_text(tomli_w.dumps(doc))
        return path

    args = ("--only", "torchvision", "--torch", "torch==2.6.0", "--skip-postcheck")
    description = "torchvision 0.21.0 (Debian's orig tarball), torch 2.6.0+cu124, one arch (8.0)"
    return Tree(
        "torchvision-0.21",
        "torchvision",
        fresh,
        recipe,
        args,
        description,
        tuple(cudakit.sandbox(cudakit.toolkit())),
    )


def host_gcc() -> int:
    done = subprocess.run(["gcc", "-dumpversion"], capture_output=True, text=True, check=True)
    return int(done.stdout.split(".")[0])


def build(
    name: str,
    scratch: Path,
    builder: Path,
    tree: Tree,
    versions: tuple[str, ...],
    jobs: int,
    env: dict[str, str],
) -> dict[str, Any]:
    """One ``torchkiln build`` of the tree for ``versions``; the row: wall time, each Python's compile step
    (status and seconds), this run's cache statistics, the wheels the manifest lists."""
    argv = [str(tree.recipe(scratch, versions)), *tree.args]
    argv += ["--source-dir", f"{tree.project}={builder / 'src'}", "--workdir", str(builder / "work")]
    argv += ["--dist", str(builder / "dist"), "--jobs", str(jobs), "--cache", "ccache"]
    argv += ["--cache-dir", str(builder / "ccache"), "--env-store", str(scratch / "envs")]
    seconds, manifest = torchkiln_build(name, argv, env, builder / "dist", tree.prefix)
    steps = {s["name"]: s for s in manifest["steps"]}
    wheel = f"{tree.project}:wheel"
    compiles = {
        v: {"status": steps[n]["status"], "seconds": steps[n]["duration_s"]}
        for v, n in ((v, wheel if v == versions[0] else f"{wheel}@{v}") for v in versions)
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


def compile_flags(env: dict[str, str]) -> dict[str, str]:
    """Each Python's CFLAGS (sysconfig), what setuptools puts on every unit's command line."""
    probe = "import sysconfig; print(sysconfig.get_config_var('CFLAGS'))"
    return {
        p: subprocess.run([f"python{p}", "-c", probe], env=env, capture_output=True, text=True).stdout.strip()
        for p in PYTHONS
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="MAX_JOBS for every build (2)")
    parser.add_argument("--tree", choices=TREES, default="pythons", help="(pythons)")
    parser.add_argument(
        "--no-one-build",
        action="store_true",
        help="leave out the last row (the three Pythons in one cold build)",
    )
    parser.add_argument("--heavy", type=int, default=24, help="pythons: heavy core units added (24)")
    parser.add_argument("--scratch", type=Path, default=None, help="where the trees and caches go")
    parser.add_argument("--results", type=Path, default=None, help="results JSON (bench/results/...)")
    args = parser.parse_args(argv)
    require("ccache", "ninja", "cmake")
    scratch = Path(tempfile.mkdtemp(prefix="kiln-pythons-", dir=args.scratch))
    trees = {"pythons": lambda: pythons_tree(args.heavy), "vision_like": vision_tree}
    tree = trees.get(args.tree, lambda: real_vision_tree(scratch))()
    started = dt.datetime.now(dt.timezone.utc)
    env = {**os.environ, "PATH": f"{python_dir(scratch, PYTHONS)}{os.pathsep}{tool_path()}"}
    a = scratch / "a"
    tree.fresh(a / "src")
    rows = []
    console.print("[bold]one Python more per run[/bold] (one work directory, one cache)")
    for n in range(1, len(PYTHONS) + 1):
        name = f"python.versions = {list(PYTHONS[:n])}"
        rows.append(build(name, scratch, a, tree, PYTHONS[:n], args.jobs, env))
    first = rows[0]["compile"][PYTHONS[0]]["seconds"]
    for r, python in zip(rows[1:], PYTHONS[1:], strict=True):
        r["fraction_of_first"] = round(r["compile"][python]["seconds"] / first, 3)
    if not args.no_one_build:
        console.print("[bold]the three Pythons in one build[/bold] (fresh work directory, empty cache)")
        b = scratch / "b"
        tree.fresh(b / "src")
        rows.append(build("one build, three Pythons, cold", scratch, b, tree, PYTHONS, args.jobs, env))
        one = rows[-1]["compile"]
        rows[-1]["fraction_of_first"] = {
            p: round(one[p]["seconds"] / one[PYTHONS[0]]["seconds"], 3) for p in PYTHONS[1:]
        }
    results = {
        "benchmark": "pythons",
        "started": started.isoformat(timespec="seconds"),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "jobs": args.jobs,
        "tree": tree.description,
        "flags": compile_flags(env),
        "command": " ".join(["python", "bench/pythons.py", *(argv if argv is not None else sys.argv[1:])]),
        "rows": rows,
    }
    out = (
        args.results
        or ROOT / "bench" / "results" / f"pythons-{tree.name}-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    table = Table(
        "run", "wall (s)", *(f"{p} compile (s)" for p in PYTHONS), "hits", title=f"pythons ({tree.name})"
    )
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
