"""Cached rebuilds of torchvision (issues 15, 38): by hand beside torchkiln, in one run.

One command, whatever machine (the lead's quiet one included)::

    python bench/rebuild.py --tree torchvision-0.21     # the real tree: upstream's torchvision 0.21.0
    python bench/rebuild.py                             # the stand-in tree, tests/data/vision_like
    python bench/rebuild.py --quick                     # CI's form (tests/test_bench.py): 4 units, 4 rows + the code edit

Trees (``--tree``):

* ``torchvision-0.21``: upstream's torchvision 0.21.0 (Debian's orig tarball, unpatched; tests/kit/realtrees.py
  fetches and checks it), its C++ ops compiled against torch 2.13.0+cpu with its optional codecs off. The
  package index has no CPU build of torch 2.6 (the torch 0.21 pairs with), so the recipe is the test recipe
  for torch 2.13 / torchvision 0.28 (tests/data/ext-cpu-test.toml) and the copy's ``version.txt`` says
  ``0.28.0a0`` (nothing else of the tree is changed): the wheel is named torchvision, so the post-build
  check runs on it. Its setup.py imports ``pkg_resources``: the build venvs get ``setuptools<81`` (torchkiln
  derives that pin itself; by hand it is given).
* ``vision_like`` (default): tests/data/vision_like, 44 units in two extensions, the wheel kiln_vision_like
  (the post-build check, which installs a wheel named torchvision, is skipped in every row).

Rows, all in one run, on one machine, ``MAX_JOBS`` the same everywhere, a Redis for the by-hand rows and one for
torchkiln's (each cold build starts from an empty one):

* by hand: ``python -m venv`` + ``pip install`` of the build tools torchkiln's build venv holds, then
  ``python -m build --wheel --no-isolation`` with the same compiler cache variables: cold (fills its local
  cache and Redis), warm (a fresh copy of the tree at the same path: **the floor**, the median of five such
  builds, two at the start, one among torchkiln's rows and two at the end), and a new machine (a
  fresh venv and pip install and the build at another path, an empty local cache, Redis warm from the by-hand
  builds: torchkiln's Redis entries are of no use to it, they are compiled against
  ``<tree>/build/torch-site/torch/include``);
* torchkiln, builder A: cold (empty local cache, Redis and environment store: fills all three), no-op, then
  ``--force``, no-op again, then (real tree) the first checked build (a fresh work directory, the post-build
  check's first run), warm local (fresh work directory and tree copy, same path), warm remote (empty local
  cache); a second builder at other paths, warm local and warm remote; a new machine: another path, warm
  Redis, empty local cache and an empty environment store (compared with the by-hand new machine).

The edit loop (bench/edits.py, issue 47): a torchkiln builder and a by-hand tree, each built once, then after
each edit (a code change in one .cpp, a header many units include, a recipe flag: ``[build] type = "Debug"``,
by hand ``DEBUG=1``) rebuilt where it was built, torchkiln's row beside by hand's (``x by hand in place``:
goal 1.2 at most), each torchkiln wheel against a fresh torchkiln build of the same source state (``= fresh``).

Each cached torchkiln row (the no-ops, ``--force``, the first checked build, the fresh work directories and the
second builders) is the median of three builds, each from the same starting state (a fresh work directory, an
empty local cache, a new path, the check's store entries removed: whatever the row names), with every
sample's wall time (``samples_s``): one 5 s build on a shared 2-core machine moves by up to 10 %, which is half
the margin asked for. The cold builds and the new machines are one build each. Each cached row compared with
the floor (``--force``, the first checked build, the fresh work directories, the second builders) also pairs
every sample with a by-hand warm build run next to it (``x paired by hand``: the median of the pairs' ratios,
which a machine that drifts between the floor's samples and the row's does not move; issue 47).

Every torchkiln row but the new machine shares one environment store (``--env-store``, empty before the cold
build), as the builds of one machine do. Each row records its wall time, the compile step (``torchvision:wheel``
by torchkiln; ``python -m build`` by hand), the steps around it (torchkiln's other steps that ran or were
reused; by hand the venv and pip install), of those the venvs restored from the environment store
(``restore_s``: each entry checked against its RECORDs and linked into the work directory, issue 47),
torchkiln's own time (``steps' own``: each step's deciding, hashing
and recording, and what the manifest's ``overhead`` says of the time outside the steps: the plan, a ``--torch``
requirement resolved there, the host's checks before the first step, publishing up to the manifest, the SBOMs
included), the **unaccounted** time (wall time minus all of those: start-up, imports, the signature after the
manifest), the cache's hits and the wheel's sha256 (a rebuild of unchanged sources gives the same bytes),
with the load average when the row started. Before each timed row (torchkiln's, by hand's build, by hand's
venv), what earlier rows and its set-up wrote is written back (``sync``): a cold build's hundreds of
megabytes, a removed work directory, the tree's fresh copy are not flushed under the next row's timing.
``x floor``: wall over the floor (``floor_s`` in the results); the new machine
row also over the by-hand new machine's. Results: bench/results/rebuild-<tree>-<UTC time>.json (or
``--results``) and a table.

Before the rows, torchkiln's own modules are compiled to bytecode (``compileall``): an installed torchkiln
has it (pip writes it), an editable one under ``PYTHONDONTWRITEBYTECODE=1`` never would, and each row would
then pay for compiling torchkiln's sources.
"""

from __future__ import annotations

import argparse
import compileall
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))

from edits import edit_rows  # noqa: E402 - after the path set-up
from run import RedisServer, console, require, settle, tool_path, torchkiln_build, wheel_by_hand  # noqa: E402

from torchkiln import cache  # noqa: E402
from torchkiln.process.environ import base_environment  # noqa: E402
from torchkiln.recipe.model import CacheSpec  # noqa: E402

VISION = ROOT / "tests" / "data" / "vision_like"
BASE_RECIPE = ROOT / "tests" / "data" / "ext-cpu-test.toml"
# what torchkiln's build venv holds for these trees (its build requirements, pip's upgrade, the torch)
BUILD_TOOLS = ("torch==2.13.0+cpu", "build", "wheel", "ninja", "numpy", "cmake")
FEATURES_OFF = "\n[torchvision.features]\npng = false\njpeg = false\nwebp = false\n"
# the form preflight's message suggests for a torch the recipe's own build is not (issue 38 item 6)
TORCH = "torch==2.13.0+cpu"
COMPILE = "torchvision:wheel"
PARTS = ("PNG", "JPEG", "WEBP", "NVJPEG", "VIDEO_CODEC", "FFMPEG")
TREES = ("vision_like", "torchvision-0.21")
WIDE = Console(highlight=False, width=220, soft_wrap=True)  # a row per line, also into a log file
QUICK_UNITS = ("csrc/vision.cpp", "csrc/ops/op_00.cpp", "csrc/io/image.cpp", "csrc/io/codec_00.cpp")


@dataclass(frozen=True)
class Tree:
    """A bench tree: how a copy is made, what by hand installs, whether the post-build check can run."""

    name: str
    description: str
    copy: Callable[[Path], None]
    setuptools: str  # the build venvs' setuptools requirement by hand
    checked: bool  # the wheel is named torchvision: the post-build check can run on it


def stand_in(quick: bool) -> Tree:
    def copy(path: Path) -> None:
        shutil.copytree(VISION, path, ignore=shutil.ignore_patterns("build", "*.egg-info", "version.py"))
        if quick:  # two units of each extension: its module and one more
            for unit in path.glob("csrc/**/*.cpp"):
                if str(unit.relative_to(path)) not in QUICK_UNITS:
                    unit.unlink()

    units = f"{len(QUICK_UNITS)} of its 44 units" if quick else "44 translation units, 2 extensions"
    return Tree("vision_like", f"tests/data/vision_like ({units})", copy, "setuptools>=77.0.3", False)


def real_vision(scratch: Path) -> Tree:
    sys.path.insert(0, str(ROOT / "tests"))
    from kit import realtrees  # noqa: PLC0415 - the tests' helper: Debian's orig tarball, checked and cached

    extracted = realtrees.extract(realtrees.VISION_0_21_0, scratch / "upstream")

    def copy(path: Path) -> None:
        shutil.copytree(extracted, path, symlinks=True)
        version = path / "version.txt"
        version.write_text("0.28.0a0\n")  # the recipe's torchvision, paired with torch 2.13
        # the extracted file's mtime: a tree without git takes SOURCE_DATE_EPOCH from its newest file, so a
        # copy written now would give every row another epoch, and another wheel (one sha256 per run)
        stamp = (extracted / "version.txt").stat().st_mtime_ns
        os.utime(version, ns=(stamp, stamp))

    description = (
        "torchvision 0.21.0 (Debian's orig tarball, unpatched but version.txt), CPU, codecs off, "
        "against torch 2.13.0+cpu"
    )
    return Tree("torchvision-0.21", description, copy, "setuptools<81", True)


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages (other work on the machine: the numbers' noise)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "-"


def fresh_tree(tree: Tree, path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tree.copy(path)
    return path


def timed(argv: list[str], **kwargs: Any) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    if done.returncode != 0:
        raise SystemExit(f"bench: {' '.join(argv)} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return time.perf_counter() - start


class ByHand:
    """The same tree built by hand: a venv, pip, ``python -m build``, the compiler cache's variables."""

    def __init__(self, tree: Tree, jobs: int, redis_url: str | None) -> None:
        self.tree, self.jobs, self.redis_url = tree, jobs, redis_url

    def venv(self, where: Path) -> tuple[Path, float]:
        """A fresh venv with the build tools: its python and the seconds it took."""
        settle()
        seconds = timed(["python3.11", "-m", "venv", str(where)])
        python = where / "bin" / "python"
        seconds += timed([str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
        tools = [*BUILD_TOOLS, self.tree.setuptools]
        seconds += timed([str(python), "-m", "pip", "install", "--quiet", *tools])
        return python, seconds

    def build(
        self,
        name: str,
        python: Path,
        root: Path,
        cache_dir: Path,
        *,
        remote: bool,
        around: float = 0.0,
        in_place: bool = False,
        extra_env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """A row: ``root``/vision built (``in_place``: the tree as it is, rebuilt where it was built; else a
        fresh copy), with ``extra_env`` (DEBUG=1) beside what torchkiln's plan sets."""
        spec = CacheSpec(kind="ccache", remote=self.redis_url if remote else None)
        config = cache.resolve_cache(spec, dir=cache_dir, basedir=root)
        environ = {**base_environment(os.environ), "PATH": f"{python.parent}{os.pathsep}{tool_path()}"}
        session = cache.open_session(config, environ)
        tree = root / "vision" if in_place else fresh_tree(self.tree, root / "vision")
        # what torchkiln's plan sets for torchvision's compile (torchkiln plan shows it), by hand
        extra = {"MAX_JOBS": str(self.jobs), "BUILD_VERSION": "0.28.0+cpu", "PYTORCH_VERSION": "2.13.0+cpu"}
        extra |= {"FORCE_CUDA": "0"} | {f"TORCHVISION_USE_{part}": "0" for part in PARTS} | (extra_env or {})
        load = loadavg()
        if not around:  # a row of its own (the new machine's settled before its venv), as torchkiln's are
            settle()
        seconds, stats = wheel_by_hand(str(python), tree, session, extra)
        return row(
            name,
            seconds + around,
            compile_s=round(seconds, 3),
            around_compile_s=round(around, 3),
            unaccounted_s=0.0,
            stats=stats.as_dict() if stats else None,
            load=load,
        )


def hits_text(stats: dict[str, Any] | None) -> str:
    """``hits/objects`` of a row's cache statistics, ``-`` for a run that compiled nothing."""
    if not stats:
        return "-"
    return f"{stats.get('hits')}/{(stats.get('hits') or 0) + (stats.get('misses') or 0)}"


def row(name: str, seconds: float, **fields: Any) -> dict[str, Any]:
    found = {"name": name, "seconds": round(seconds, 3), **fields}
    WIDE.print(
        f"  {name:<60} {seconds:8.2f} s  compile {fields.get('compile_s', 0):6.2f}  around "
        f"{fields.get('around_compile_s', 0):6.2f}  restore {fields.get('restore_s', 0):5.2f}  "
        f"steps' own {fields.get('steps_overhead_s', 0):5.2f}  "
        f"unaccounted {fields.get('unaccounted_s', 0):5.2f}  hits {hits_text(found.get('stats'))}"
    )
    return found


class Torchkiln:
    """``torchkiln build`` of a tree as torchvision, one row per call."""

    def __init__(self, tree: Tree, scratch: Path, redis_url: str | None, jobs: int) -> None:
        self.tree, self.scratch, self.jobs = tree, scratch, jobs
        self.local = scratch / "recipe-local.toml"
        self.remote = scratch / "recipe-remote.toml"
        text = BASE_RECIPE.read_text().replace('name = "ext-cpu-test"', 'name = "bench-vision"')
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
        checks: bool = False,
        env_store: str = "envs",
        recipe: Path | None = None,
    ) -> dict[str, Any]:
        recipe = recipe or (self.remote if remote else self.local)
        argv = [str(recipe), "--only", "torchvision", "--torch", TORCH]
        argv += ["--source-dir", f"torchvision={builder / 'vision'}", "--workdir", str(builder / "work")]
        argv += ["--dist", str(builder / "dist"), "--jobs", str(self.jobs), "--cache", "ccache"]
        argv += ["--cache-dir", str(cache_dir), *([] if checks else ["--skip-postcheck"])]
        argv += ["--env-store", str(self.scratch / env_store), *(["--force"] if force else [])]
        env = {**os.environ, "PATH": tool_path()}
        load = loadavg()
        seconds, manifest = torchkiln_build(name, argv, env, builder / "dist")
        steps = {s["name"]: s for s in manifest["steps"]}
        spent = {n: s["duration_s"] or 0.0 for n, s in steps.items() if s["status"] in ("ran", "reused")}
        compile_s = spent.get(COMPILE, 0.0)
        around = sum(v for n, v in spent.items() if n != COMPILE)
        # the venvs restored from the environment store: each entry checked and linked (issue 47)
        restore = sum(v for n, v in spent.items() if steps[n]["status"] == "reused")
        # torchkiln's own time for each step (deciding, hashing, probing, recording, keeping), by step, and
        # outside them: the host's checks before the first step, publishing up to the manifest
        overhead = sum(s.get("overhead_s") or 0.0 for s in steps.values())
        overhead += sum((manifest.get("overhead") or {}).values())
        return row(
            name,
            seconds,
            compile_s=round(compile_s, 3),
            around_compile_s=round(around, 3),
            restore_s=round(restore, 3),
            steps_overhead_s=round(overhead, 3),
            unaccounted_s=round(seconds - compile_s - around - overhead, 3),
            ran=[n for n, s in steps.items() if s["status"] == "ran"],
            reused=[n for n, s in steps.items() if s["status"] == "reused"],
            steps={
                n: {"status": s["status"], "seconds": s["duration_s"], "overhead_s": s.get("overhead_s")}
                for n, s in steps.items()
            },
            outside_steps_s=manifest.get("overhead") or {},
            stats=manifest.get("cache"),
            wheel_sha256=manifest["wheels"][0]["sha256"],
            checks=None if not checks else manifest.get("checks", {}).get("torchvision"),
            check_s=round(sum(v for n, v in spent.items() if n.startswith("checks:")), 3),
            facts_from=facts_from(builder / "work") if checks else None,
            load=load,
        )

    def fresh_builder(self, path: Path) -> Path:
        for part in ("work", "dist"):
            shutil.rmtree(path / part, ignore_errors=True)
        fresh_tree(self.tree, path / "vision")
        return path


def facts_from(work: Path) -> str | None:
    """Which interpreter gave the check's facts, as its log says (torchkiln.build.postcheck): the one started
    during the compile (issue 47), the one that imported torch while pip installed, or a fresh one."""
    log = work / "logs" / "latest" / "checks-import.log"
    said = [line for line in log.read_text().splitlines() if "postcheck: the facts from" in line]
    return said[-1].partition("the facts from ")[2] if said else None


SAMPLES = 3  # each cached torchkiln row: the median of this many builds from the same starting state


def sampled(
    name: str,
    one: Callable[[str], dict[str, Any]],
    n: int = SAMPLES,
    pair: Callable[[str], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The row ``name`` measured ``n`` times, each sample from the same starting state (``one`` prepares and
    builds one, given its name): the median sample (by wall time, its parts as measured in it), with every
    sample's wall time (``samples_s``) and its parts (``samples``: the unaccounted time, the wheel's sha256).
    One build of 5 s on a shared 2-core machine moves by up to 10 %.

    With ``pair`` (a by-hand warm build, the floor's kind), each sample is paired with one by hand's, run
    next to it, after it and before it in turn: ``paired_by_hand_s`` their wall times, and
    ``ratio_to_paired_by_hand`` the median of the pairs' ratios, which a machine that slows or speeds up
    between the floor's samples and the row's does not move."""
    samples, hands = [], []
    for i in range(n):
        label = f"{name} ({i + 1}/{n})"
        if pair is not None and i % 2:
            hands.append(pair(f"by hand, paired with {label}"))
        samples.append(one(label))
        if pair is not None and not i % 2:
            hands.append(pair(f"by hand, paired with {label}"))
    middle = sorted(samples, key=lambda r: r["seconds"])[len(samples) // 2]
    parts = ("seconds", "compile_s", "restore_s", "steps_overhead_s", "unaccounted_s", "wheel_sha256")
    parts += ("check_s", "facts_from")
    every = [{k: r.get(k) for k in parts} for r in samples]
    out = {**middle, "name": name, "samples_s": [r["seconds"] for r in samples], "samples": every}
    if hands:
        out["paired_by_hand_s"] = [h["seconds"] for h in hands]
        pairs = [r["seconds"] / h["seconds"] for r, h in zip(samples, hands, strict=True)]
        out["ratio_to_paired_by_hand"] = round(statistics.median(pairs), 2)
    return out


def forget_checks(store: Path) -> None:
    """The environment store without the post-build check's entries: the next checked build is the check's
    first run again (a fresh machine's first checked build, with the build's own entries kept)."""
    for meta in store.glob("*/meta.json"):
        if json.loads(meta.read_text()).get("step", "").startswith("checks:"):
            shutil.rmtree(meta.parent)


def full_rows(tree: Tree, scratch: Path, redis: tuple[str, str], jobs: int) -> list[dict[str, Any]]:
    """Every row; ``redis``: the by-hand builds' Redis and torchkiln's (two servers: each cold build is cold,
    though a unit that includes nothing of torch's has the same hash either way). Each cached torchkiln row is
    the median of :data:`SAMPLES` builds (:func:`sampled`); the floor the median of five by-hand warm builds,
    two at the start, one among torchkiln's rows, two at the end."""
    rows: list[dict[str, Any]] = []
    hand = ByHand(tree, jobs, redis[0])
    console.print("[bold]by hand[/bold] (the floor)")
    python, around = hand.venv(scratch / "hand" / "venv")
    rows.append(hand.build("by hand cold (fills local + Redis)", python, scratch / "hand", scratch / "hand-cache", remote=True, around=around))  # fmt: skip

    floor_python = python

    def floor(name: str) -> dict[str, Any]:
        return hand.build(name, floor_python, scratch / "hand", scratch / "hand-cache", remote=False)

    rows += [floor(f"by hand warm (fresh copy, same path): the floor's sample {i}") for i in (1, 2)]
    other = scratch / "hand-elsewhere" / "deeper"
    python, around = hand.venv(other / "venv")
    rows.append(hand.build("by hand new machine: fresh venv + pip at another path, warm Redis", python, other, scratch / "hand-cache-new", remote=True, around=around))  # fmt: skip

    kiln = Torchkiln(tree, scratch, redis[1], jobs)
    a = kiln.fresh_builder(scratch / "a")
    store = scratch / "envs"
    console.print("[bold]torchkiln[/bold], builder A")
    rows.append(
        kiln.build("torchkiln cold (fills local + Redis + env store)", a, scratch / "cache-a", remote=True)
    )
    rows.append(sampled("torchkiln no-op", lambda n: kiln.build(n, a, scratch / "cache-a", remote=True)))
    rows.append(sampled("torchkiln --force", lambda n: kiln.build(n, a, scratch / "cache-a", remote=True, force=True), pair=floor))  # fmt: skip
    rows.append(sampled("torchkiln no-op after --force", lambda n: kiln.build(n, a, scratch / "cache-a", remote=True)))  # fmt: skip
    rows.append(floor("by hand warm again: the floor's sample 3"))
    if tree.checked:

        def checked(n: str) -> dict[str, Any]:
            forget_checks(store)
            return kiln.build(n, kiln.fresh_builder(a), scratch / "cache-a", remote=False, checks=True)

        rows.append(sampled("torchkiln first checked build: fresh workdir, the check's first run", checked, pair=floor))  # fmt: skip
    rows.append(sampled("torchkiln warm local, fresh workdir, same path", lambda n: kiln.build(n, kiln.fresh_builder(a), scratch / "cache-a", remote=False), pair=floor))  # fmt: skip
    fresh = iter(range(1, 100))
    rows.append(sampled("torchkiln warm remote, empty local, same path", lambda n: kiln.build(n, kiln.fresh_builder(a), scratch / f"cache-b{next(fresh)}", remote=True), pair=floor))  # fmt: skip
    rows.append(sampled("second builder, other path, warm local", lambda n: kiln.build(n, kiln.fresh_builder(scratch / "elsewhere" / "deeper" / f"b{next(fresh)}"), scratch / "cache-a", remote=False), pair=floor))  # fmt: skip

    def second_remote(n: str) -> dict[str, Any]:
        i = next(fresh)
        return kiln.build(
            n, kiln.fresh_builder(scratch / "x" / f"c{i}"), scratch / f"cache-c{i}", remote=True
        )

    rows.append(sampled("second builder, other path, warm remote", second_remote, pair=floor))
    d = kiln.fresh_builder(scratch / "y" / "d")
    rows.append(kiln.build("torchkiln new machine: other path, warm remote, empty local cache, empty env store", d, scratch / "cache-d", remote=True, env_store="envs-new-machine"))  # fmt: skip
    rows += [floor(f"by hand warm at the end: the floor's sample {i}") for i in (4, 5)]
    rows += edit_loop(tree, kiln, hand, floor_python, scratch)
    return rows


def edit_loop(
    tree: Tree, kiln: Torchkiln, hand: ByHand, python: Path, scratch: Path, only: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """The edit loop (bench/edits.py): a builder and a by-hand tree, each built once, then each edit rebuilt
    in place by both (the local cache of the rows before: warm)."""
    console.print("[bold]the edit loop[/bold]: rebuilt where it was built")
    e = kiln.fresh_builder(scratch / "e")
    rows = [
        kiln.build("torchkiln edit loop: the first build of its tree", e, scratch / "cache-a", remote=False)
    ]
    rows.append(hand.build("by hand edit loop: the first build of its tree", python, scratch / "hand-e", scratch / "hand-cache", remote=False))  # fmt: skip

    def kiln_build(name: str, builder: Path, recipe: Path | None) -> dict[str, Any]:
        return kiln.build(name, builder, scratch / "cache-a", remote=False, recipe=recipe)

    def hand_build(name: str, where: Path, extra: dict[str, str]) -> dict[str, Any]:
        return hand.build(name, python, where.parent, scratch / "hand-cache", remote=False, in_place=True, extra_env=extra)  # fmt: skip

    return rows + edit_rows(
        tree.name, kiln_build, hand_build, e, scratch / "hand-e" / "vision", kiln.local, only
    )


def quick_rows(tree: Tree, scratch: Path, jobs: int) -> list[dict[str, Any]]:
    """CI's form: torchkiln cold and no-op, the floor's code once (by hand in torchkiln's build venv), a fresh
    work directory paired with a by-hand build (one sample), and the edit loop's code edit (one unit
    changed, rebuilt in place by both, the wheel against a fresh build's)."""
    kiln = Torchkiln(tree, scratch, None, jobs)
    a = kiln.fresh_builder(scratch / "a")
    rows = [kiln.build("torchkiln cold", a, scratch / "cache-a", remote=False)]
    rows.append(kiln.build("torchkiln no-op", a, scratch / "cache-a", remote=False))
    hand = ByHand(tree, jobs, None)
    rows.append(
        hand.build(
            "by hand warm (quick form: torchkiln's build venv, its cache)",
            a / "work" / "venv" / "bin" / "python",
            scratch / "hand",
            scratch / "cache-hand",
            remote=False,
        )
    )
    python = a / "work" / "venv" / "bin" / "python"

    def warm(n: str) -> dict[str, Any]:
        return kiln.build(n, kiln.fresh_builder(a), scratch / "cache-a", remote=False)

    def by_hand(n: str) -> dict[str, Any]:
        return hand.build(n, python, scratch / "hand", scratch / "cache-hand", remote=False)

    rows.append(sampled("torchkiln warm local, fresh workdir, same path", warm, n=1, pair=by_hand))
    return rows + edit_loop(tree, kiln, hand, python, scratch, only=("code",))


def ratios(rows: list[dict[str, Any]]) -> float | None:
    """``x floor`` of every row; the torchkiln new machine's also against the by-hand new machine's. The floor
    is the median of the by-hand warm builds: five in a full run (two at the start, one among torchkiln's rows,
    two at the end: a single 5 s build moves by up to 10 %), one in the quick form."""
    samples = [r["seconds"] for r in rows if r["name"].startswith("by hand warm")]
    floor = statistics.median(samples) if samples else None
    new = next((r["seconds"] for r in rows if r["name"].startswith("by hand new machine")), None)
    for r in rows:
        r["ratio_to_floor"] = round(r["seconds"] / floor, 2) if floor else None
        if new and r["name"].startswith("torchkiln new machine"):
            r["ratio_to_by_hand_new_machine"] = round(r["seconds"] / new, 2)
    return floor


def print_table(rows: list[dict[str, Any]], title: str) -> None:
    table = Table(
        "run",
        "wall (s)",
        "x floor",
        "compile (s)",
        "around (s)",
        "restore (s)",
        "steps' own (s)",
        "unaccounted (s)",
        "hits",
        "wheel",
        title=title,
    )
    for r in rows:
        ratio = "-" if r.get("ratio_to_floor") is None else f"{r['ratio_to_floor']:.2f}"
        if "ratio_to_by_hand_new_machine" in r:
            ratio += f" ({r['ratio_to_by_hand_new_machine']:.2f} x by hand)"
        if r.get("ratio_to_paired_by_hand") is not None:  # a cached row: over the by-hand builds beside it
            ratio += f" ({r['ratio_to_paired_by_hand']:.2f} x paired by hand)"
        if r.get("ratio_to_by_hand") is not None:  # an edit row: over by hand's row of the same edit
            ratio += f" ({r['ratio_to_by_hand']:.2f} x by hand in place)"
        sha = str(r.get("wheel_sha256", "-"))[:12]
        if "same_wheel_as_fresh" in r:
            sha += " = fresh" if r["same_wheel_as_fresh"] else " != fresh"
        table.add_row(
            r["name"],
            f"{r['seconds']:.2f}",
            ratio,
            f"{r['compile_s']:.2f}",
            f"{r['around_compile_s']:.2f}",
            "-" if r.get("restore_s") is None else f"{r['restore_s']:.2f}",
            f"{r.get('steps_overhead_s', 0.0):.2f}",
            f"{r['unaccounted_s']:.2f}",
            hits_text(r.get("stats")),
            sha,
        )
    WIDE.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--tree", choices=TREES, default="vision_like", help="(vision_like)")
    parser.add_argument("--quick", action="store_true", help="CI's form: the stand-in's 4 units, 4 rows")
    parser.add_argument("--jobs", type=int, default=2, help="MAX_JOBS for every build (2)")
    parser.add_argument("--scratch", type=Path, default=None, help="where the trees and caches go")
    parser.add_argument("--results", type=Path, default=None, help="results JSON (bench/results/...)")
    args = parser.parse_args(argv)
    if args.quick and args.tree != "vision_like":
        parser.error("--quick builds the stand-in tree (vision_like)")
    require("ccache", "ninja", "python3.11", *([] if args.quick else ["redis-server"]))
    compileall.compile_dir(ROOT / "src" / "torchkiln", quiet=1)  # as an install does: see the docstring
    scratch = Path(tempfile.mkdtemp(prefix="kiln-rebuild-", dir=args.scratch))
    started = dt.datetime.now(dt.timezone.utc)
    tree = real_vision(scratch) if args.tree == "torchvision-0.21" else stand_in(args.quick)
    load = loadavg()
    try:
        if args.quick:
            rows = quick_rows(tree, scratch, args.jobs)
        else:
            servers = []
            try:
                for name in ("redis-hand", "redis-kiln"):
                    (scratch / name).mkdir()
                    servers.append(RedisServer(scratch / name))
                rows = full_rows(tree, scratch, (servers[0].url, servers[1].url), args.jobs)
            finally:
                for server in servers:
                    server.stop()
        floor = ratios(rows)
        results = {
            "benchmark": "rebuild",
            "started": started.isoformat(timespec="seconds"),
            "host": {
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
            },
            "load": {"start": load, "end": loadavg()},
            "jobs": args.jobs,
            "tree": tree.description,
            "quick": args.quick,
            "torch": TORCH,
            "floor_s": floor,
            "command": " ".join(
                ["python", "bench/rebuild.py", *(argv if argv is not None else sys.argv[1:])]
            ),
            "rows": rows,
        }
        name = (
            f"rebuild-{tree.name}{'-quick' if args.quick else ''}-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
        )
        out = args.results or ROOT / "bench" / "results" / name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
        print_table(rows, f"rebuild: {tree.description} (load {load} at the start)")
        console.print(f"results: {out}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
