"""What distributed compiles cost and gain per translation unit, measured on loopback, and the model.

A real sccache-dist cluster on 127.0.0.1 (:class:`torchkiln.distributed.loopback.LoopbackCluster`: one
scheduler, two build servers in bubblewrap sandboxes) and the real sccache client configured by
:mod:`torchkiln.distributed.client`. Needs root and bubblewrap, like a build server.

Measured, each ``--repeat`` times (medians reported), one compile at a time:

* per translation unit, a compile through sccache locally and on the cluster (``SCCACHE_RECACHE=1``: every
  run compiles, none is a cache hit). Units: ``tiny`` (one function: nothing but the fixed costs), ``aten``
  (tests/data/cache_ext/csrc/scale.cpp, <ATen/core/Tensor.h>), ``extension`` (module.cpp,
  <torch/extension.h>: a typical torch TU's headers) and ``cuda`` (tests/data/cluster_ext/csrc/kernel.cu through
  nvcc, when installed). The difference is the per-compile overhead of distribution;
* CPU seconds per compile of the local sccache server (preprocessing, packaging, sending: what the
  build machine still does for a remote compile) and of the build servers (the compile and its sandbox);
* what is sent: the unit's ``-fdirectives-only`` preprocessed source, zlib-compressed as sccache does;
* the toolchain, once: the first remote compile with an empty client toolchain cache (sccache packages the
  compiler), then with a fresh cluster but the toolchain packaged (the upload), against a warm compile.

Every machine runs on the same cores here, so loopback shows costs, not the speed-up: the speed-up is
the model's (docs/performance.md), which this script prints from the measured figures (``--model-*``).

    sudo python bench/cluster_bench.py --repeat 3      # results: bench/results/cluster-<UTC time>.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from torchkiln.distributed import client, cluster, loopback, spec  # noqa: E402 - after the path set-up
from torchkiln.distributed.stats import ClusterStats  # noqa: E402

CACHE_EXT = ROOT / "tests" / "data" / "cache_ext"
CLUSTER_EXT = ROOT / "tests" / "data" / "cluster_ext"
CUDA_HOME = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
console = Console(highlight=False)


def tool_path() -> str:
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])


# --------------------------------------------------------------------------------------------------
# Translation units.
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unit:
    name: str
    source: Path
    argv: tuple[str, ...]  # compiler and flags, without -c SOURCE -o OBJECT

    def command(self, obj: Path) -> list[str]:
        return [*self.argv, "-c", str(self.source), "-o", str(obj)]


def units(scratch: Path) -> list[Unit]:
    """The units measured, with torch.utils.cpp_extension's include paths and the flags of a Release build."""
    from torch.utils.cpp_extension import include_paths

    includes = [f"-I{p}" for p in [*include_paths(), sysconfig.get_paths()["include"]]]
    cxx = (
        "g++",
        "-O3",
        "-std=c++20",
        "-fPIC",
        "-DTORCH_EXTENSION_NAME=_C",
        "-DTORCH_API_INCLUDE_EXTENSION_H",
    )
    tiny = scratch / "tiny.cpp"
    tiny.write_text("int kiln_tiny(int x) { return x * 3 + 1; }\n")
    found = [
        Unit("tiny", tiny, cxx),
        Unit("aten", CACHE_EXT / "csrc" / "scale.cpp", (*cxx, *includes)),
        Unit("extension", CACHE_EXT / "csrc" / "module.cpp", (*cxx, *includes)),
    ]
    nvcc = CUDA_HOME / "bin" / "nvcc"
    if nvcc.exists():
        cu = (
            str(nvcc),
            "-O3",
            "-std=c++20",
            "--compiler-options",
            "-fPIC",
            "-gencode=arch=compute_75,code=sm_75",
        )
        found.append(Unit("cuda", CLUSTER_EXT / "csrc" / "kernel.cu", cu))
    return found


def sent_bytes(unit: Unit) -> tuple[int, int] | None:
    """(preprocessed bytes, zlib-compressed bytes) of what the client sends for a g++ unit; None for nvcc."""
    if unit.argv[0] != "g++":
        return None
    done = subprocess.run(
        [*unit.argv, "-E", "-fdirectives-only", str(unit.source)], capture_output=True, check=True
    )
    return len(done.stdout), len(zlib.compress(done.stdout, 1))


# --------------------------------------------------------------------------------------------------
# The sccache client and CPU accounting.
# --------------------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime + children's (waited-for) utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / CLOCK_TICKS


def sccache_pid(sock: str) -> int:
    """The pid of the sccache server listening on ``sock`` (found by its environment)."""
    needle = f"SCCACHE_SERVER_UDS={sock}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if proc.joinpath("comm").read_text().strip() == "sccache" and needle in proc.joinpath(
                "environ"
            ).read_bytes().split(b"\0"):
                return int(proc.name)
        except OSError:
            continue
    raise SystemExit(f"bench: no sccache server on {sock}")


@dataclass
class Session:
    env: dict[str, str]
    pid: int

    def compile(self, unit: Unit, out: Path) -> float:
        start = time.perf_counter()
        done = subprocess.run(
            ["sccache", *unit.command(out)],
            env={**self.env, "SCCACHE_RECACHE": "1"},
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"bench: {unit.name} failed:\n{done.stderr[-2000:]}")
        return seconds

    def stats(self) -> ClusterStats:
        text = subprocess.run(
            ["sccache", "--show-stats", "--stats-format=json"],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return ClusterStats.from_sccache_json(text)


@contextmanager
def session(root: Path, found: loopback.LoopbackCluster | None, toolchains: Path) -> Iterator[Session]:
    """A private sccache server (empty cache), distributing to ``found`` when given."""
    run_dir = Path(tempfile.mkdtemp(prefix="kiln-bench-", dir="/tmp"))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SCCACHE_", "CCACHE_"))},
        "PATH": tool_path(),
        "SCCACHE_DIR": str(root / "cache"),
        "SCCACHE_SERVER_UDS": str(run_dir / "sccache.sock"),
        "SCCACHE_IDLE_TIMEOUT": "0",
        "SCCACHE_CONF": str(run_dir / "none.toml"),
    }
    prepared = None
    if found is not None:
        wanted = spec.ClusterSpec(found.url, credentials_env="KILN_BENCH_TOKEN")
        prepared = client.prepare_client(
            wanted, {"KILN_BENCH_TOKEN": found.client_token}, run_dir=run_dir, toolchain_dir=toolchains
        )
        if prepared.warnings and prepared.spec is None:
            raise SystemExit(f"bench: {prepared.warnings[0]}")
        env.update(prepared.env)
    subprocess.run(["sccache", "--start-server"], env=env, check=True, capture_output=True)
    try:
        yield Session(env, sccache_pid(env["SCCACHE_SERVER_UDS"]))
    finally:
        subprocess.run(["sccache", "--stop-server"], env=env, capture_output=True, check=False)
        if prepared is not None:
            client.finish_client(prepared)
        shutil.rmtree(run_dir, ignore_errors=True)


def archive_bytes(toolchains: Path) -> int:
    """Bytes of the packaged toolchains in a client toolchain cache (compressed tarballs)."""
    tc = toolchains / "client" / "tc"
    return sum(p.stat().st_size for p in tc.rglob("*") if p.is_file()) if tc.exists() else 0


# --------------------------------------------------------------------------------------------------
# Measurements.
# --------------------------------------------------------------------------------------------------


def measure_unit(
    unit: Unit, repeat: int, scratch: Path, found: loopback.LoopbackCluster, toolchains: Path
) -> dict[str, Any]:
    """Local and remote compiles of one unit, alternating (the machine's load drifts; pairs see the same).

    The remote session compiles once first: packaging and uploading the toolchain is measured on its own.
    """
    source = str(unit.source.relative_to(ROOT)) if unit.source.is_relative_to(ROOT) else unit.name
    result: dict[str, Any] = {"unit": unit.name, "source": source}
    out = scratch / f"{unit.name}.o"
    with (
        session(scratch / f"{unit.name}-local", None, toolchains) as local,
        session(scratch / f"{unit.name}-remote", found, toolchains) as remote,
    ):
        remote.compile(unit, out)
        sessions = {"local": local, "remote": remote}
        before = {mode: (s.stats(), cpu_seconds(s.pid)) for mode, s in sessions.items()}
        seconds: dict[str, list[float]] = {"local": [], "remote": []}
        for _ in range(repeat):
            for mode, s in sessions.items():
                seconds[mode].append(s.compile(unit, out))
        after = {mode: (s.stats(), cpu_seconds(s.pid)) for mode, s in sessions.items()}
    for mode in ("local", "remote"):
        stats = after[mode][0]
        remote_runs = stats.remote - before[mode][0].remote
        if mode == "remote" and (remote_runs < repeat or stats.fallback):
            raise SystemExit(f"bench: {unit.name} did not run on the cluster ({stats.summary()})")
        result[mode] = {
            "runs_s": [round(x, 3) for x in seconds[mode]],
            "median_s": round(statistics.median(seconds[mode]), 3),
            "sccache_compiles_per_run": (stats.compilations - before[mode][0].compilations) / repeat,
            "remote_per_run": remote_runs / repeat,
            "client_cpu_s_per_run": round((after[mode][1] - before[mode][1]) / repeat, 3),
        }
        runs = " ".join(f"{x:.2f}" for x in seconds[mode])
        console.print(f"  {unit.name:<10} {mode:<6} {statistics.median(seconds[mode]):7.2f} s  runs {runs}")
    pairs = [r - loc for loc, r in zip(seconds["local"], seconds["remote"], strict=True)]
    result["overhead_s"] = round(statistics.median(pairs), 3)
    sent = sent_bytes(unit)
    if sent:
        result["preprocessed_bytes"], result["sent_bytes"] = sent
    result["object_bytes"] = out.stat().st_size
    return result


def measure_toolchain(unit: Unit, scratch: Path, bwrap: str, warm_s: float) -> dict[str, Any]:
    """First remote compile with nothing packaged; then on fresh servers with the toolchain packaged."""
    toolchains = scratch / f"tc-{unit.name}"
    times = []
    for attempt in ("package", "upload"):
        with loopback.LoopbackCluster(
            scratch / f"cluster-{unit.name}-{attempt}", servers=1, bwrap=bwrap
        ) as found:
            with session(scratch / f"{unit.name}-{attempt}", found, toolchains) as s:
                times.append(s.compile(unit, scratch / f"{unit.name}-first.o"))
    first, uploaded = times
    result = {
        "unit": unit.name,
        "first_compile_s": round(first, 3),
        "first_on_new_server_s": round(uploaded, 3),
        "warm_s": warm_s,
        "package_s": round(first - uploaded, 3),
        "upload_s": round(uploaded - warm_s, 3),
        "archive_bytes": archive_bytes(toolchains),
    }
    console.print(
        f"  toolchain for {unit.name}: package {result['package_s']:.1f} s, upload {result['upload_s']:.1f} s, "
        f"{result['archive_bytes'] / 2**20:.0f} MiB"
    )
    return result


# --------------------------------------------------------------------------------------------------
# The model.
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """A cold build, as the model sees it. Every figure is an input; docs/performance.md says where from."""

    compile_cpu_h: float  # W: CPU hours of the build's compiles on one machine
    cpp_units: int  # C++ files
    cuda_units: int  # .cu files
    archs: int  # CUDA architectures: cicc and ptxas run once per arch
    local_cores: int  # L: the build machine
    serial_h: float  # configure, code generation, final links: never distributed
    tail_h: float  # the longest compile (or chain) that nothing can split

    @property
    def remote_compiles(self) -> int:
        """sccache compiles a cluster runs: each C++ file; per .cu file cudafe++, host g++, cicc+ptxas per arch."""
        return self.cpp_units + self.cuda_units * (2 + 2 * self.archs)

    @property
    def local_preprocessing(self) -> int:
        """Preprocessor runs left on the build machine: each C++ file; per .cu file the host side and each arch."""
        return self.cpp_units + self.cuda_units * (2 + self.archs)


def predict(
    work: Workload, servers: int, cores: int, overhead_s: float, client_cpu_s: float
) -> dict[str, Any]:
    """Hours of a cold build on ``servers`` x ``cores`` (0 servers: the build machine alone); what bounds it."""
    if servers == 0:
        phase, bound = work.compile_cpu_h / work.local_cores, "local cores"
    else:
        cluster_h = (work.compile_cpu_h + work.remote_compiles * overhead_s / 3600) / (servers * cores)
        client_h = work.local_preprocessing * client_cpu_s / 3600 / work.local_cores
        phase, bound = max((cluster_h, "cluster cores"), (client_h, "build machine (preprocessing)"))
    if work.tail_h > phase:
        phase, bound = work.tail_h, "longest compile"
    return {"hours": round(work.serial_h + phase, 2), "bound": bound}


def model_table(
    work: Workload, overhead_s: float, client_cpu_s: float, shapes: list[tuple[int, int]]
) -> list[dict[str, Any]]:
    rows = [{"servers": 0, "cores": work.local_cores, **predict(work, 0, 0, overhead_s, client_cpu_s)}]
    rows += [{"servers": n, "cores": c, **predict(work, n, c, overhead_s, client_cpu_s)} for n, c in shapes]
    return rows


def print_model(work: Workload, overhead_s: float, client_cpu_s: float) -> dict[str, Any]:
    """The model's table for the usual cluster shapes; returns inputs and rows for the results file."""
    shapes = [(n, c) for c in (32, 64) for n in (1, 2, 4, 8, 16)]
    rows = model_table(work, overhead_s, client_cpu_s, shapes)
    title = (
        f"model: W={work.compile_cpu_h} CPU-h, {work.remote_compiles} remote compiles, L={work.local_cores}"
    )
    table = Table("servers x cores", "hours", "bounded by", title=title)
    for row in rows:
        shape = f"local {row['cores']}" if row["servers"] == 0 else f"{row['servers']} x {row['cores']}"
        table.add_row(shape, f"{row['hours']:.2f}", row["bound"])
    console.print(table)
    counts = {"remote_compiles": work.remote_compiles, "local_preprocessing": work.local_preprocessing}
    measured = {"overhead_s": overhead_s, "client_cpu_s": client_cpu_s}
    return {"inputs": vars(work) | counts | measured, "rows": rows}


# --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="compiles per unit and mode (default 3)")
    parser.add_argument("--results", type=Path, default=None, help="results JSON (default bench/results/...)")
    parser.add_argument("--model-cpu-hours", type=float, default=26.0, help="W (default: PyTorch PR #49773)")
    parser.add_argument("--model-cpp-units", type=int, default=5000, help="C++ files of the build")
    parser.add_argument("--model-cuda-units", type=int, default=1500, help=".cu files of the build")
    parser.add_argument("--model-archs", type=int, default=5, help="CUDA architectures (PR #49773: 5)")
    parser.add_argument("--model-local-cores", type=int, default=32, help="L: the build machine's cores")
    parser.add_argument("--model-serial-hours", type=float, default=0.2, help="configure + codegen + links")
    parser.add_argument("--model-tail-hours", type=float, default=0.25, help="the longest single compile")
    parser.add_argument(
        "--model-from", type=Path, default=None, help="measure nothing: the model from a results file"
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    work = Workload(
        args.model_cpu_hours, args.model_cpp_units, args.model_cuda_units, args.model_archs,
        args.model_local_cores, args.model_serial_hours, args.model_tail_hours,
    )  # fmt: skip
    if args.model_from is not None:
        measured = json.loads(args.model_from.read_text())["model"]["inputs"]
        print_model(work, measured["overhead_s"], measured["client_cpu_s"])
        return 0
    bwrap = shutil.which("bwrap")
    problems = cluster.server_host_problems(bwrap) + (
        ["sccache-dist is not installed"] if not cluster.find_sccache_dist() else []
    )
    if problems or bwrap is None:
        raise SystemExit("bench: " + "; ".join(problems))
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    results: dict[str, Any] = {
        "started": stamp,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load": os.getloadavg()},
        "repeat": args.repeat,
    }
    with tempfile.TemporaryDirectory(prefix="torchkiln-cluster-bench-") as tmp:
        scratch = Path(tmp)
        found_units = units(scratch)
        console.print("[bold]per compile[/bold] (local sccache vs the loopback cluster)")
        toolchains = scratch / "tc-shared"
        with loopback.LoopbackCluster(scratch / "cluster", servers=2, bwrap=bwrap) as found:
            per_unit = [
                # The tiny unit measures only the fixed cost, which is small: it gets more samples (cheap).
                measure_unit(u, args.repeat * (5 if u.name == "tiny" else 1), scratch, found, toolchains)
                for u in found_units
            ]
        console.print("[bold]toolchain, once[/bold]")
        warm = {r["unit"]: r["remote"]["median_s"] for r in per_unit}
        toolchain = [
            measure_toolchain(u, scratch, bwrap, warm[u.name])
            for u in found_units
            if u.name in ("tiny", "cuda")
        ]
    results["units"], results["toolchains"] = per_unit, toolchain
    results["machine"]["load_after"] = os.getloadavg()

    table = Table(
        "unit",
        "local (s)",
        "remote (s)",
        "overhead (s)",
        "build machine CPU remote/local (s)",
        "sent (KiB)",
        title="per compile, medians",
    )
    for r in per_unit:
        table.add_row(
            r["unit"], f"{r['local']['median_s']:.2f}", f"{r['remote']['median_s']:.2f}", f"{r['overhead_s']:+.2f}",
            f"{r['remote']['client_cpu_s_per_run']:.2f} / {r['local']['client_cpu_s_per_run']:.2f}",
            f"{r['sent_bytes'] / 1024:.0f}" if "sent_bytes" in r else "-",
        )  # fmt: skip
    console.print(table)

    # The model's two measured figures: the fixed cost of sending a compile (the tiny unit: its compile takes
    # no time, the rest is distribution) and the build machine's CPU per remote compile of a TU with torch's
    # headers (the extension unit: preprocessing, hashing, compressing, sending).
    by_name = {r["unit"]: r for r in per_unit}
    overhead = max(by_name["tiny"]["overhead_s"], 0.0)
    client_cpu = by_name["extension"]["remote"]["client_cpu_s_per_run"]
    results["model"] = print_model(work, overhead, client_cpu)

    path = args.results or ROOT / "bench" / "results" / f"cluster-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(results, indent=2) + "\n")
    os.replace(partial, path)
    console.print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
