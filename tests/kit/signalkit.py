"""A torchkiln build signalled while a step is in flight: the stand-in tree, the command, what runs (issue 47).

Shared by tests/test_signals.py and tests/test_cluster.py (which assert the mechanism: the exit code, nothing of
the build left running, the cache tool's server gone, the rerun's wheel) and bench/interrupts.py (which
times the exit). The build is the real plan of a torchvision build with ``--torch``: its environment steps
run pip (the last of them, ``torchvision:install-torch``, installs torch: the pip in flight), its compile
step compiles tests/data/vision_like's four units of the quick bench form plus :data:`SPIN_UNIT`, a unit
whose compile takes seconds of CPU (constexpr evaluation, no flags needed): a signal that lands while it
compiles finds a compiler in flight, and a torchkiln that waited for it would leave its object behind.

A cell is found in flight by the processes themselves (the spin unit's ``cc1plus``, the pip installing
torch), never by sleeping. What belongs to the build is what carries its run's mark (``TORCHKILN_RUN``,
read from the process in flight), what was in the process groups its processes were in, and whatever names
the cell's directory in its argv or working directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from kit import ROOT
from torchkiln.build.treeguard import OutputRecords
from torchkiln.plan.make import TORCH_SITE
from torchkiln.process import runner
from torchkiln.source.exact import stats, tree_paths

VISION = ROOT / "tests" / "data" / "vision_like"
BASE_RECIPE = ROOT / "tests" / "data" / "ext-cpu-test.toml"
UNITS = ("csrc/vision.cpp", "csrc/ops/op_00.cpp", "csrc/io/image.cpp", "csrc/io/codec_00.cpp")
SPIN_UNIT = "csrc/ops/op_spin.cpp"
# Two constant expressions of a million loop turns each, within GCC's default limits (262144 turns per
# loop, 2**25 operations per expression): about 4 s of CPU each on a 2-core machine.
SPIN = """// stands in for a unit whose compile takes a while: the compiler evaluates these at compile time
constexpr unsigned long spin(unsigned long seed) {
  unsigned long s = seed;
  for (unsigned long i = 0; i < 1000; ++i)
    for (unsigned long j = 0; j < 1000; ++j) s += (i * j) ^ (s >> 3);
  return s;
}
static_assert(spin(1) != 1, "spun");
static_assert(spin(2) != 1, "spun");
int kiln_spun() { return 0; }
"""
TORCH = "torch==2.13.0+cpu"
FEATURES_OFF = "\n[torchvision.features]\npng = false\njpeg = false\nwebp = false\n"
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}
STEPS = ("env", "compile")
KINDS = ("none", "ccache", "sccache", "sccache-dist")


def make_tree(path: Path) -> Path:
    """The stand-in tree at ``path`` (made afresh): vision_like's four quick units and the spin unit."""
    if path.exists():
        shutil.rmtree(path)
    shutil.copytree(VISION, path, ignore=shutil.ignore_patterns("build", "*.egg-info", "version.py"))
    for unit in path.glob("csrc/**/*.cpp"):
        if str(unit.relative_to(path)) not in UNITS:
            unit.unlink()
    spin = path / SPIN_UNIT
    spin.write_text(SPIN)
    # the copied files' time (copytree keeps them): a tree without git takes SOURCE_DATE_EPOCH, and so its
    # wheel's timestamps, from its newest file; a unit written now would make every copy's wheel another
    stamp = (VISION / "setup.py").stat().st_mtime_ns
    os.utime(spin, ns=(stamp, stamp))
    return path


def write_recipe(path: Path, extra: str = "") -> Path:
    """The test recipe as a torchvision build with its optional codecs off (``extra``: more TOML)."""
    text = BASE_RECIPE.read_text().replace('name = "ext-cpu-test"', 'name = "signals"')
    path.write_text(text + FEATURES_OFF + extra)
    return path


@dataclass(frozen=True)
class Cell:
    """One build to signal: where it builds and with what cache."""

    base: Path  # the cell's directory: tree, work, dist, cache
    recipe: Path
    kind: str  # none, ccache, sccache, sccache-dist (sccache with the recipe's [cluster])
    env_store: str = "off"  # off: every environment step runs pip
    sandbox: bool = True
    environ: dict[str, str] = field(default_factory=dict)  # added to the command's environment
    extra: tuple[str, ...] = ()  # more arguments (a scheduler's)
    run: str = ""  # another work directory and dist/ for the same tree and cache ("-fresh")
    checks: bool = (
        False  # with the post-build check (the stand-in's wheel is not torchvision: it fails there)
    )

    @property
    def tree(self) -> Path:
        return self.base / "vision"

    @property
    def work(self) -> Path:
        return self.base / f"work{self.run}"

    @property
    def dist(self) -> Path:
        return self.base / f"dist{self.run}"

    @property
    def cache(self) -> Path:
        return self.base / "cache"

    def argv(self) -> list[str]:
        tool = "sccache" if self.kind == "sccache-dist" else self.kind
        argv = [sys.executable, "-m", "torchkiln", "build", str(self.recipe), "--only", "torchvision"]
        argv += ["--torch", TORCH, "--source-dir", f"torchvision={self.tree}", "--workdir", str(self.work)]
        argv += ["--dist", str(self.dist), "--cache", tool, "--cache-dir", str(self.cache), "--jobs", "2"]
        argv += [
            *([] if self.checks else ["--skip-postcheck"]),
            "--env-store",
            self.env_store,
            *([] if self.sandbox else ["--no-sandbox"]),
        ]
        return [*argv, *self.extra]

    def env(self) -> dict[str, str]:
        tools = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])
        return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PATH": tools, **self.environ}

    def start(self) -> subprocess.Popen[bytes]:
        """The build, started (SIGINT at its default: a background shell's children ignore it)."""
        return subprocess.Popen(
            self.argv(),
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=self.base,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509 - one call
        )

    def build(self, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(), env=self.env(), capture_output=True, text=True, cwd=self.base, timeout=timeout
        )

    def wheel_sha256(self) -> str:
        (wheel,) = self.dist.glob("*.whl")
        return hashlib.sha256(wheel.read_bytes()).hexdigest()

    def spun(self) -> list[Path]:
        """The spin unit's objects in the tree: one only when its compile ran to its end."""
        return sorted((self.tree / "build").rglob("op_spin.o"))


# --------------------------------------------------------------------------------------------------
# What runs: read from /proc.
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    cmdline: str
    cwd: str


def processes() -> list[Proc]:
    """Every process this user can see that is not a zombie."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        state = fields[0].decode()
        if state in ("Z", "X"):
            continue
        found.append(
            Proc(int(entry.name), int(fields[1]), int(fields[2]), int(fields[3]), state, cmdline, cwd)
        )
    return found


def environ_has(pid: int, text: str) -> bool:
    try:
        return text.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def run_mark(pid: int) -> str | None:
    """The ``TORCHKILN_RUN=<id>`` a process of the build carries."""
    with contextlib.suppress(OSError):
        for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if item.startswith(b"TORCHKILN_RUN="):
                return item.decode()
    return None


def descendants(roots: Iterable[int], found: list[Proc]) -> set[int]:
    """``roots`` and every process below them."""
    children: dict[int, list[int]] = {}
    for p in found:
        children.setdefault(p.ppid, []).append(p.pid)
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo.extend(children.get(pid, []))
    return seen


def unlowered(root: int) -> None:
    """Every scheduling group below ``root`` (a build) that is lower than this process's raised back to it
    (runner.restore, what the build itself does once it waits for its early work). A cell that waits for
    the early work to reach a state while the compile runs needs that work to run: lowered beside a CPU-bound
    compile on a machine whose other core other tests keep busy, it gets next to nothing."""
    for pid in descendants([root], processes()):
        runner.restore(pid)  # a group already at this process's level is only read


def below(daemons: set[int]) -> Callable[[Proc], bool]:
    """Whether a process is one of ``daemons`` or runs below one (a loopback cluster's build servers and the
    compiles they run: not the build's, though they compile its units)."""

    def foreign(p: Proc) -> bool:
        pid = p.pid
        for _ in range(64):
            if pid in daemons:
                return True
            try:
                pid = int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                return False
            if pid <= 1:
                return False
        return False

    return foreign


def in_flight(cell: Cell, step: str) -> list[Proc]:
    """The processes that show ``step`` at work: the spin unit's compiler, or the pip installing torch."""
    if step == "compile":
        # ccache hands the compiler paths under its base directory relative (its working directory the tree's
        # build/): the unit by name, in the tree by its argv or working directory
        unit, tree = Path(SPIN_UNIT).name, str(cell.tree)
        return [
            p
            for p in processes()
            if "cc1plus" in p.cmdline and unit in p.cmdline and (tree in p.cmdline or p.cwd.startswith(tree))
        ]
    return [
        p
        for p in processes()
        if " -m pip install " in p.cmdline and str(cell.work) in p.cmdline and TORCH in p.cmdline
    ]


@dataclass
class Snapshot:
    """What belonged to the build while its step was in flight."""

    mark: str | None
    groups: set[int]
    sessions: set[int]
    seconds_to_flight: float


def wait_in_flight(cell: Cell, step: str, proc: subprocess.Popen[bytes], timeout: float = 900) -> Snapshot:
    """Once ``step`` is in flight: the run's mark and the process groups and sessions of its processes
    (torchkiln's descendants and what carries its mark: a daemonized sccache server is no descendant)."""
    start = time.monotonic()
    while True:
        busy = in_flight(cell, step)
        if busy:
            break
        if proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise AssertionError(
                f"the build ended (exit {proc.returncode}) before {step} was in flight:\n{out[-3000:]}"
            )
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{step} never got in flight within {timeout} s")
        time.sleep(0.05)
    mark = next((m for m in map(run_mark, (p.pid for p in busy)) if m), None)
    everything = processes()
    ours = descendants([proc.pid], everything) - {proc.pid}
    ours |= {p.pid for p in everything if mark and environ_has(p.pid, mark)}
    chosen = [p for p in everything if p.pid in ours]
    return Snapshot(
        mark,
        {p.pgid for p in chosen},
        {p.sid for p in chosen},
        time.monotonic() - start,
    )


def survivors(
    cell: Cell, snapshot: Snapshot, *, foreign: Callable[[Proc], bool] = lambda p: False
) -> list[str]:
    """What of the build still runs: a process carrying its mark, in one of its process groups or sessions,
    or naming the cell's directory in its argv or working directory (``foreign``: what is not the build's,
    e.g. a loopback cluster's build servers)."""
    me = os.getpid()
    base = str(cell.base)
    left = []
    for p in processes():
        if p.pid == me or foreign(p):
            continue
        if (
            (snapshot.mark and environ_has(p.pid, snapshot.mark))
            or p.pgid in snapshot.groups
            or p.sid in snapshot.sessions
            or base in p.cmdline
            or p.cwd == base
            or p.cwd.startswith(base + "/")
        ):
            left.append(f"{p.pid} ({p.state}) {p.cmdline[:160]}")
    return left


def settled(check: Callable[[], list[str]], seconds: float = 5.0) -> list[str]:
    """``check()`` until it finds nothing or ``seconds`` passed (a SIGKILLed process is gone within
    milliseconds; this only absorbs the kernel's delivery, it measures nothing)."""
    deadline = time.monotonic() + seconds
    found = check()
    while found and time.monotonic() < deadline:
        time.sleep(0.05)
        found = check()
    return found


def sccache_servers(cell: Cell) -> list[str]:
    """sccache processes serving the cell's cache directory (the build's server)."""
    needle = f"SCCACHE_DIR={cell.cache}"
    return [
        f"{p.pid} {p.cmdline[:120]}"
        for p in processes()
        if "sccache" in p.cmdline and environ_has(p.pid, needle)
    ]


def unrecorded(cell: Cell) -> list[str]:
    """What lies where the build writes in the cell's tree (build/, an ``*.egg-info``) with a stat its
    compile did not record: written after the build recorded its outputs (a cache server's compile, its
    depfile written as it preprocesses, still at work then). ``build/torch-site``, the link to the build venv's
    torch, is no output: no tree includes it (treeguard.skipped)."""
    recorded = OutputRecords(cell.work).owned("torchvision")
    now = stats(cell.tree, tree_paths(cell.tree, skip=[cell.tree / "build" / TORCH_SITE]))
    return sorted(
        name
        for name, st in now.items()
        if (name.startswith("build/") or ".egg-info/" in name) and st not in recorded.get(name, ())
    )


@dataclass
class Stopped:
    """A signalled build: how it ended, what it printed, the snapshot taken in flight."""

    pid: int  # torchkiln's
    returncode: int
    output: str
    snapshot: Snapshot
    seconds: float  # from the signal to torchkiln's exit (the bench's number; tests do not read it)


def signal_in_flight(cell: Cell, step: str, signum: int, timeout: float = 900) -> Stopped:
    """Start ``cell``'s build, send ``signum`` once ``step`` is in flight, wait for torchkiln to exit."""
    proc = cell.start()
    try:
        snapshot = wait_in_flight(cell, step, proc, timeout)
        sent = time.monotonic()
        proc.send_signal(signum)
        proc.wait(timeout=120)
        seconds = time.monotonic() - sent
        output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return Stopped(proc.pid, proc.returncode, output, snapshot, seconds)


def check_stopped(
    cell: Cell,
    step: str,
    signum: int,
    reference: str | None = None,
    foreign: Callable[[Proc], bool] = lambda p: False,
) -> None:
    """Signal ``cell``'s build (its tree made afresh) once ``step`` is in flight, then assert the invariant:
    the exit code of the signal, nothing published, nothing of the build running on (``foreign``: what is not
    the build's), the cache's server and socket gone, the compile in flight killed (not waited for); and that
    the same command then gives the wheel ``reference`` names, or without one, the wheel a build of the same
    tree from an empty work directory gives (with the cache the rerun left)."""
    make_tree(cell.tree)
    stopped = signal_in_flight(cell, step, signum)
    assert stopped.returncode == EXIT_CODES[signum], stopped.output[-3000:]
    assert "dist/ is unchanged" in stopped.output and "Traceback" not in stopped.output, stopped.output
    assert not list(cell.dist.glob("*.whl")), "nothing published"
    assert settled(lambda: survivors(cell, stopped.snapshot, foreign=foreign)) == [], "nothing runs on"
    assert sccache_servers(cell) == [], "the build's cache server is gone"
    sockets = Path(tempfile.gettempdir()).glob(f"torchkiln-sccache-{stopped.pid}-*")
    assert not list(sockets), "its socket too"
    if step == "compile":
        # the spin unit was in flight: had anything waited for its compiler, its object would be there
        assert cell.spun() == [], "the compile in flight was killed, not waited for"
    assert unrecorded(cell) == [], "nothing wrote into the tree after the build recorded its outputs"
    again = cell.build()
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert sccache_servers(cell) == []
    if reference is None:
        fresh = replace(cell, run="-fresh")
        make_tree(fresh.tree)
        done = fresh.build()
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        reference = fresh.wheel_sha256()
    assert cell.wheel_sha256() == reference, "the rerun gives the wheel an uninterrupted build gives"
