"""Two different builds in one process, interleaved, record what two processes record (issue 48).

The invariant (docs/architecture.md, build/): what a build learns lives in its own objects (its
``BuildSetup``, ``BuildRecord``, ``VenvReuse`` and each step's ``StepRun``); module-level state in the build
path is immutable or a memo whose answer is a function of its key alone, and what a process-wide facility
keeps per build (the watchdog's mark, the confinement of probes, where ELF readings are kept) is a context
variable of the build's own thread. So two builds running at once in one process cannot see each other.

Each build here is a stand-in plan of real commands (test_steps.py's way) over its own recipe, tree and
wheel, with the same step names (a kind that kept what a step found by its name would mix the two up), an
environment store and the sandbox where the host has one. The steps meet at a rendezvous the test drives
(files in each work directory, which a sandboxed step may write): B's venv is made after A's compile started,
both compiles overlap (each is prepared before either ends) and B's compile goes on once A has published, so
A's whole build ends while B's compile still runs. The same two builds run first in two processes, then, at the same paths from the same inputs, in two
threads of this one; their manifests, lock files, state.json records, work directories and environment
stores must be equal once times and log paths are left out.
"""

from __future__ import annotations

import contextvars
import importlib
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kit import ROOT
from kit.dists import tiny_wheel
from rich.console import Console

from torchkiln.build.loop import BuildOptions, run_build
from torchkiln.cache import resolve_cache
from torchkiln.plan.make import make_plan
from torchkiln.plan.model import Plan, Step
from torchkiln.recipe.loader import load_recipe

HERE = ROOT / "tests"
RECIPE = HERE / "data" / "ext-cpu-test.toml"
BUILDS = ("a", "b")
# the tree's newest file: each build's SOURCE_DATE_EPOCH (a tree without git), different on purpose
MTIMES = {"a": 1_000_000_000, "b": 1_300_000_000}
PAUSE_S = {"a": "0", "b": "1"}  # B's compile goes on after A published: it outlasts A's whole build
RENDEZVOUS_S = 120.0

# One program for every step: mark that it started, wait for the rendezvous, pause, then do its part.
STEP = r"""
import os, shutil, sys, time, venv
mark, wait, pause, action, *args = sys.argv[1:]
if mark:
    open(mark, "w").close()
deadline = time.monotonic() + float(os.environ.get("RENDEZVOUS_S", "120"))
while wait and not os.path.exists(wait):
    if time.monotonic() > deadline:
        sys.exit(f"error: no rendezvous at {wait}")
    time.sleep(0.02)
time.sleep(float(pause))
if action == "venv":
    venv.create(args[0], with_pip=False, symlinks=True)
elif action == "copy":
    shutil.copy(args[0], args[1])
"""


def rendezvous(root: Path, which: str) -> Path:
    return root / which / "work" / "rendezvous"


def step_argv(mark: Path | None, wait: Path | None, pause: str, action: str, *args: str) -> tuple[str, ...]:
    return (sys.executable, "-c", STEP, str(mark or ""), str(wait or ""), pause, action, *args)


def prepare_inputs(root: Path, which: str) -> None:
    """The build's recipe, tree (its one file's time fixed) and the wheel its compile copies; its work
    directory's rendezvous. Made the same way for the run in processes and the run in threads."""
    base = root / which
    for name in ("work", "dist", "store", "src"):
        shutil.rmtree(base / name, ignore_errors=True)
    text = RECIPE.read_text()
    recipe = base / "recipe.toml"
    base.mkdir(parents=True, exist_ok=True)
    recipe.write_text(text if which == "a" else text.replace('"ext-cpu-test"', '"ext-cpu-other"'))
    src = base / "src"
    src.mkdir()
    setup = src / "setup.py"
    setup.write_text(f"# stands in for torch ({which})\n")
    os.utime(setup, (MTIMES[which], MTIMES[which]))
    made = base / "made"
    if not made.is_dir():
        made.mkdir()
        tiny_wheel(made, "torch", "2.13.0+cpu", files={"torch/which.txt": which})
    rendezvous(root, which).mkdir(parents=True)


def plan_for(root: Path, which: str) -> Plan:
    """The test recipe's plan (B: another recipe name) with its steps replaced by the program above."""
    base = root / which
    plan = make_plan(
        load_recipe(base / "recipe.toml"),
        workdir=base / "work",
        dist=base / "dist",
        source_dirs={"torch": base / "src"},
        only="torch",
        cache=resolve_cache(None, kind="none"),
        jobs=1,
        env_store=base / "store",
    )
    here = rendezvous(root, which)
    venv = plan.paths.venv
    wheelhouse = plan.paths.wheelhouse / "torch"
    wheel = next((base / "made").glob("*.whl"))
    after_a = here / "a-compiling" if which == "b" else None
    go = here / ("a-published" if which == "b" else "go")
    steps = [
        Step(
            "build-env:venv",
            "env",
            "",
            step_argv(None, after_a, "0", "venv", str(venv)),
            fresh=str(venv),
            creates=str(venv / "bin" / "python"),
            venv=str(venv),
        ),
        Step(
            "torch:wheel",
            "compile",
            "torch",
            step_argv(here / "compiling", go, PAUSE_S[which], "copy", str(wheel), str(wheelhouse)),
            {"MAX_JOBS": "1"},
            wheels=str(wheelhouse),
        ),
        next(s for s in plan.steps if s.kind == "publish"),
    ]
    return replace(plan, steps=steps)


def build_one(root: Path, which: str) -> list[str]:
    """One build (a thread's, or a process's: ``python -c`` imports this module): the steps that ran."""
    out = io.StringIO()
    result = run_build(
        plan_for(root, which), BuildOptions(console=Console(file=out, width=200), skip_postcheck=True)
    )
    return result.ran


# Module-level state a build may change: memos whose answer is a function of their key alone, so that
# builds sharing them get what each would get alone (docs/architecture.md, build/). Anything else a build
# changes at module level is state two builds in one process would share.
MEMOS = {
    "torchkiln.files.digests._KNOWN": "a file's sha256 by its identity (device, inode, size, mtime, ctime)",
    "torchkiln.process.isolation._PROBED": "whether bubblewrap sandboxes here, by its real path",
}


def _deep(value: Any, depth: int = 0) -> Any:
    """``value`` as plain data, into containers and objects' attributes (what a build could change)."""
    if depth > 8:
        return repr(value)
    if isinstance(value, (str, bytes, int, float, bool, type(None))):
        return value
    if isinstance(value, Mapping):
        return sorted((repr(k), _deep(v, depth + 1)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [_deep(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(repr(v) for v in value)
    if hasattr(value, "__dict__") and not callable(value):
        return (type(value).__qualname__, _deep(vars(value), depth + 1))
    return repr(value)


def module_state() -> dict[str, Any]:
    """Every data value torchkiln's loaded modules hold at their top level (not their modules, classes,
    functions or context variables, whose values are per thread), as plain data."""
    found = {}
    for name, module in sorted(sys.modules.items()):
        if not name.startswith("torchkiln") or module is None:
            continue
        for attr, value in vars(module).items():
            if attr.startswith("__") or isinstance(value, (types.ModuleType, type, contextvars.ContextVar)):
                continue
            if callable(value) or f"{name}.{attr}" in MEMOS:
                continue
            found[f"{name}.{attr}"] = _deep(value)
    return found


def coordinate(root: Path, stop: threading.Event) -> None:
    """The rendezvous: A's compile started -> B's venv may be made; both compiles started -> A's compile
    goes on; A published -> B's compile goes on."""
    a, b = rendezvous(root, "a"), rendezvous(root, "b")
    deadline = time.monotonic() + RENDEZVOUS_S
    gates = (
        (a / "compiling", b / "a-compiling"),
        (b / "compiling", a / "go"),
        (root / "a" / "dist" / "manifest.json", b / "a-published"),
    )
    for seen, then in gates:
        while not seen.exists() and not stop.is_set() and time.monotonic() < deadline:
            time.sleep(0.02)
        then.touch()


@pytest.fixture
def driven(tmp_path: Path) -> Iterator[Callable[[Callable[[str], list[str]]], dict[str, list[str]]]]:
    """Runs both builds through ``one`` (concurrently), with the rendezvous driven meanwhile."""
    stops: list[threading.Event] = []

    def run(one: Callable[[str], list[str]]) -> dict[str, list[str]]:
        for which in BUILDS:
            prepare_inputs(tmp_path, which)
        stop = threading.Event()
        stops.append(stop)
        driver = threading.Thread(target=coordinate, args=(tmp_path, stop), daemon=True)
        driver.start()
        try:
            with ThreadPoolExecutor(max_workers=2) as pool:
                futures = {which: pool.submit(one, which) for which in BUILDS}
                return {which: future.result() for which, future in futures.items()}
        finally:
            stop.set()
            driver.join()

    yield run
    for stop in stops:
        stop.set()


TIMES = frozenset(
    {"started", "finished", "duration_s", "overhead_s", "last_run_s", "overhead", "log", "phases"}
)


def _timeless(data: Any) -> Any:
    """``data`` without what differs between two runs of the same build: times, and log paths (a run's
    log directory is named by its start)."""
    if isinstance(data, dict):
        return {k: _timeless(v) for k, v in data.items() if k not in TIMES and k != "stages"}
    if isinstance(data, list):
        return [_timeless(v) for v in data]
    return data


def differences(found: Any, want: Any, where: str = "") -> list[str]:
    """Where two JSON-like values differ, each as ``path: found != wanted``."""
    if isinstance(found, dict) and isinstance(want, dict):
        out = []
        for key in sorted(set(found) | set(want), key=str):
            out += differences(found.get(key, "<absent>"), want.get(key, "<absent>"), f"{where}/{key}")
        return out
    if isinstance(found, list) and isinstance(want, list) and len(found) == len(want):
        return [
            d
            for i, (f, w) in enumerate(zip(found, want, strict=True))
            for d in differences(f, w, f"{where}[{i}]")
        ]
    return [] if found == want else [f"{where}: {found!r} != {want!r}"]


def records(root: Path, which: str) -> dict[str, Any]:
    """What the build left: its manifest, lock file, state.json, work directory and store (by name)."""
    base = root / which
    work, dist = base / "work", base / "dist"

    def names(top: Path, *, leave: tuple[str, ...] = ()) -> list[str]:
        found = [p.relative_to(top).as_posix() for p in top.rglob("*")]
        return sorted(n for n in found if not n.startswith(leave))

    return {
        "manifest": _timeless(json.loads((dist / "manifest.json").read_text())),
        "lock": json.loads(next(dist.glob("*.lock.json")).read_text()),
        "dist": names(dist),
        "state": _timeless(json.loads((work / "state.json").read_text())),
        "work": names(work, leave=("logs", "rendezvous", "build.lock")),
        "store": names(base / "store"),
    }


def test_two_builds_interleaved_in_one_process_record_what_two_processes_do(
    tmp_path: Path, driven: Callable[[Callable[[str], list[str]]], dict[str, list[str]]]
) -> None:
    imported: set[str] = set()  # what a build imports, loaded here before the builds in threads

    def in_a_process(which: str) -> list[str]:
        code = "import sys; sys.path[:0] = sys.argv[1:2]; import json, test_two_builds as t; "
        code += "from pathlib import Path; ran = t.build_one(Path(sys.argv[2]), sys.argv[3]); "
        code += "print(json.dumps([ran, sorted(m for m in sys.modules if m.startswith('torchkiln'))]))"
        done = subprocess.run(
            [sys.executable, "-c", code, str(HERE), str(tmp_path), which],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        ran, modules = json.loads(done.stdout.splitlines()[-1])
        imported.update(modules)
        return list(ran)

    apart = driven(in_a_process)
    expected = {which: records(tmp_path, which) for which in BUILDS}
    assert apart == {which: ["build-env:venv", "torch:wheel", "publish"] for which in BUILDS}
    assert expected["a"]["manifest"]["build_env"] != expected["b"]["manifest"]["build_env"], (
        "two different builds: each compile's SOURCE_DATE_EPOCH is its own tree's"
    )

    for name in sorted(imported):
        importlib.import_module(name)
    before = module_state()
    together = driven(lambda which: build_one(tmp_path, which))
    assert together == apart
    changed = [name for name, value in module_state().items() if before.get(name, value) != value]
    assert changed == [], "module-level state the builds changed: two builds in one process share it"
    for which in BUILDS:
        found = differences(records(tmp_path, which), expected[which])
        assert found == [], f"build {which}: what it left differs from what its own process left"
