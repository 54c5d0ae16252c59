"""The shared compiler cache against a real Redis (Debian's redis-server on a loopback port).

Builds tests/data/cache_ext (a torch C++ extension, three translation units, cpp_extension + ninja) with
``python -m build --wheel --no-isolation`` and the variables from :mod:`torchkiln.cache`:

* builder A: empty local cache A + Redis (cold, fills both);
* builder B: a *different* checkout path, an empty local cache B, the same Redis: every object comes
  from the remote store and the extension is bit-identical;
* a wrong password or a closed port: one warning, and the build still succeeds.

The same for sccache (multi-level disk + redis). Each cold build of the extension is about a minute of
CPU, so the module builds cold once per tool and reuses the warm caches.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from kit import ROOT
from kit.imagekit import need as need_on

from torchkiln import cache
from torchkiln.cache.ccache import parse_stats
from torchkiln.process.environ import base_environment
from torchkiln.recipe.model import CacheSpec

pytestmark = [pytest.mark.integration, pytest.mark.redis]

EXT = ROOT / "tests" / "data" / "cache_ext"
PASSWORD = "kiln-Redis-pw-7f3a"
TRANSLATION_UNITS = 3


def tool_path() -> str:
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])


def need(tool: str) -> None:
    """The tool on :func:`tool_path` (this interpreter's bin first)."""
    need_on(tool, tool_path())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Redis:
    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"


def start_redis(password: str | None, workdir: Path) -> Redis:
    port = free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    argv += ["--dir", str(workdir)]
    if password:
        argv += ["--requirepass", password]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return Redis(port, process)
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("redis-server did not start listening within 10 s")


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Redis]:
    need("redis-server")
    server = start_redis(PASSWORD, tmp_path_factory.mktemp("redis"))
    yield server
    server.process.terminate()
    server.process.wait(timeout=10)


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secret") / "redis.password"
    path.write_text(PASSWORD + "\n")
    path.chmod(0o600)
    return path


@dataclass
class Built:
    so_sha256: str
    stats: cache.CacheStats
    warnings: tuple[str, ...]
    log: str


def build_extension(checkout: Path, config: cache.CacheConfig) -> Built:
    """Copy the extension to ``checkout`` and build its wheel the way torchkiln's build steps run."""
    shutil.copytree(EXT, checkout)
    environ = {**base_environment(os.environ), "PATH": tool_path(), "MAX_JOBS": "2"}
    session = cache.open_session(replace(config, basedir=checkout.parent), environ)
    env = {**environ, **session.public_env, **session.secret_env}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "build", "--wheel", "--no-isolation"],
            cwd=checkout,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    finally:
        stats = session.close()
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    (wheel,) = (checkout / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (so_name,) = [n for n in archive.namelist() if n.endswith(".so")]
        so_sha256 = hashlib.sha256(archive.read(so_name)).hexdigest()
        record = archive.read(next(n for n in archive.namelist() if n.endswith("RECORD"))).decode()
    # The wheel's own RECORD agrees with the bytes we hashed.
    expected = base64.urlsafe_b64encode(bytes.fromhex(so_sha256)).rstrip(b"=").decode()
    assert f"{so_name},sha256={expected}," in record
    assert stats is not None
    return Built(so_sha256, stats, session.warnings, log)


def ccache_config(cache_dir: Path, remote: str | None, **extra: str) -> cache.CacheConfig:
    return cache.resolve_cache(CacheSpec(kind="ccache", remote=remote, **extra), dir=cache_dir)


@pytest.fixture(scope="module")
def ccache_cold(
    redis: Redis, secret_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Built, Path]:
    """Builder A: cold local cache, Redis with a password (from a credentials file)."""
    need("ccache")
    root = tmp_path_factory.mktemp("builder-a")
    config = ccache_config(root / "ccache", redis.url, credentials_file=str(secret_file))
    return build_extension(root / "checkout" / "cache_ext", config), root / "ccache"


def test_ccache_cold_build_fills_local_and_remote(ccache_cold: tuple[Built, Path]) -> None:
    built, _ = ccache_cold
    assert built.warnings == ()
    assert (built.stats.hits, built.stats.misses) == (0, TRANSLATION_UNITS)
    assert built.stats.remote_misses == TRANSLATION_UNITS and built.stats.errors == 0
    assert PASSWORD not in built.log


def test_ccache_second_builder_gets_objects_from_redis(
    ccache_cold: tuple[Built, Path], redis: Redis, secret_file: Path, tmp_path: Path
) -> None:
    cold, _ = ccache_cold
    config = ccache_config(tmp_path / "empty-ccache", redis.url, credentials_file=str(secret_file))
    built = build_extension(tmp_path / "elsewhere" / "cache_ext", config)
    assert built.warnings == ()
    assert built.stats.hit_rate is not None and built.stats.hit_rate >= 0.9
    assert (built.stats.remote_hits, built.stats.local_hits) == (TRANSLATION_UNITS, 0)
    assert built.so_sha256 == cold.so_sha256
    cache.enforce_min_hit_rate(built.stats, 0.9)


@pytest.mark.parametrize("failure", ["wrong password", "closed port"])
def test_ccache_unusable_remote_warns_once_and_builds(
    failure: str, ccache_cold: tuple[Built, Path], redis: Redis, tmp_path: Path
) -> None:
    cold, warm_dir = ccache_cold
    local = tmp_path / "ccache"
    shutil.copytree(warm_dir, local)  # a builder whose local cache is warm: the outage must not matter
    if failure == "wrong password":
        remote, environ_secret = redis.url, "not-the-password"
        expected = f"remote cache {redis.url} refuses the credentials (WRONGPASS)"
    else:
        remote, environ_secret = f"redis://127.0.0.1:{free_port()}", PASSWORD
        expected = "is unreachable (Connection refused)"
    os.environ["KILN_TEST_REDIS_SECRET"] = environ_secret
    try:
        config = ccache_config(local, remote, credentials_env="KILN_TEST_REDIS_SECRET")
        built = build_extension(tmp_path / "checkout" / "cache_ext", config)
    finally:
        del os.environ["KILN_TEST_REDIS_SECRET"]
    assert len(built.warnings) == 1
    assert expected in built.warnings[0]
    assert built.warnings[0].endswith("building with the local cache only, this build will be slower")
    assert environ_secret not in built.warnings[0]
    assert (built.stats.hits, built.stats.remote_hits) == (TRANSLATION_UNITS, 0)
    assert built.so_sha256 == cold.so_sha256


@pytest.mark.parametrize("failure", ["wrong password", "closed port"])
def test_ccache_itself_survives_a_remote_that_fails_mid_build(
    failure: str, redis: Redis, tmp_path: Path
) -> None:
    """If the store dies after the check, ccache logs a remote error and compiles anyway (no failure)."""
    need("ccache")
    port = redis.port if failure == "wrong password" else free_port()
    env = {
        **base_environment(os.environ),
        "PATH": tool_path(),
        "CCACHE_DIR": str(tmp_path / "cc"),
        "CCACHE_REMOTE_STORAGE": f"redis://wrong-{PASSWORD}@127.0.0.1:{port}",
    }
    (tmp_path / "a.c").write_text("int a(void) { return 1; }\n")
    done = subprocess.run(
        ["ccache", "gcc", "-c", "a.c"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    stats = parse_stats(
        subprocess.run(
            ["ccache", "--print-stats"], env=env, capture_output=True, text=True, check=True
        ).stdout
    )
    assert stats.misses == 1 and stats.errors >= 1


def test_check_remote_reports_each_failure(redis: Redis, tmp_path: Path) -> None:
    def check(remote: str, secret: str | None) -> str | None:
        spec = CacheSpec(kind="ccache", remote=remote, credentials_env="S" if secret else None)
        return cache.check_remote(cache.resolve_cache(spec, dir=tmp_path), {"S": secret} if secret else {})

    assert check(redis.url, PASSWORD) is None
    assert (
        check(redis.url, None)
        == f"remote cache {redis.url} requires a password (set cache.credentials_env or credentials_file)"
    )
    assert check(redis.url, "nope") == f"remote cache {redis.url} refuses the credentials (WRONGPASS)"
    closed = f"redis://127.0.0.1:{free_port()}"
    assert check(closed, PASSWORD) == f"remote cache {closed} is unreachable (Connection refused)"


# --------------------------------------------------------------------------------------------------
# sccache: the same through cpp_extension (which finds ccache first on PATH and must hand over).
# --------------------------------------------------------------------------------------------------


def sccache_config(cache_dir: Path, remote: str | None, secret_file: Path) -> cache.CacheConfig:
    spec = CacheSpec(kind="sccache", remote=remote, credentials_file=str(secret_file) if remote else None)
    return cache.resolve_cache(spec, dir=cache_dir)


def test_sccache_second_builder_gets_objects_from_redis(
    redis: Redis, secret_file: Path, tmp_path: Path
) -> None:
    need("sccache")
    need("ccache")  # present on PATH on purpose: cpp_extension would pick it, CCACHE_PREFIX hands over
    cold = build_extension(
        tmp_path / "a" / "cache_ext", sccache_config(tmp_path / "sc-a", redis.url, secret_file)
    )
    assert (cold.stats.hits, cold.stats.misses) == (0, TRANSLATION_UNITS)
    assert cold.stats.by_language == {"C/C++": (0, TRANSLATION_UNITS)}
    warm = build_extension(
        tmp_path / "b" / "cache_ext", sccache_config(tmp_path / "sc-b", redis.url, secret_file)
    )
    assert warm.warnings == ()
    assert warm.stats.hit_rate is not None and warm.stats.hit_rate >= 0.9
    assert (warm.stats.remote_hits, warm.stats.local_hits) == (TRANSLATION_UNITS, 0)
    assert warm.so_sha256 == cold.so_sha256
    assert PASSWORD not in cold.log + warm.log

    # A wrong password: sccache alone would fail every compile; torchkiln drops the store and warns once.
    bad = tmp_path / "bad.password"
    bad.write_text("wrong\n")
    bad.chmod(0o600)
    local = tmp_path / "sc-c"
    shutil.copytree(tmp_path / "sc-a", local, ignore=shutil.ignore_patterns("sccache.sock"))
    built = build_extension(tmp_path / "c" / "cache_ext", sccache_config(local, redis.url, bad))
    assert len(built.warnings) == 1 and "refuses the credentials (WRONGPASS)" in built.warnings[0]
    assert (built.stats.hits, built.stats.remote_hits) == (TRANSLATION_UNITS, None)


# --------------------------------------------------------------------------------------------------
# Issue 14 item 4: the documented USER:PASSWORD secret, with a real Redis ACL user, for both tools.
# --------------------------------------------------------------------------------------------------

ACL_USER = "kiln"
ACL_PASSWORD = "kiln-Acl-pw-91c2"


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Redis]:
    """A Redis whose default user is off: only the ACL user ``kiln`` (with its own password) gets in."""
    need("redis-server")
    need("redis-cli")
    server = start_redis(PASSWORD, tmp_path_factory.mktemp("redis-acl"))
    cli = ["redis-cli", "-p", str(server.port), "--no-auth-warning", "-a", PASSWORD]
    for command in (
        ["ACL", "SETUSER", ACL_USER, "on", f">{ACL_PASSWORD}", "~*", "+@all"],
        ["ACL", "SETUSER", "default", "off"],
    ):
        done = subprocess.run([*cli, *command], capture_output=True, text=True, check=True)
        assert done.stdout.strip() == "OK", done.stdout + done.stderr
    yield server
    server.process.terminate()
    server.process.wait(timeout=10)


@pytest.mark.parametrize("kind", ["ccache", "sccache"])
def test_user_colon_password_secret_reaches_redis_for_both_tools(
    kind: str, acl_redis: Redis, tmp_path: Path
) -> None:
    need(kind)
    secret = tmp_path / "redis.secret"
    secret.write_text(f"{ACL_USER}:{ACL_PASSWORD}\n")
    secret.chmod(0o600)
    source = tmp_path / "one.c"
    source.write_text(f"int one_{kind}(void) {{ return 1; }}\n")
    environ = {**base_environment(os.environ), "PATH": tool_path()}
    found = []
    for builder in ("a", "b"):  # two builders, each with an empty local cache: b's object comes from Redis
        spec = CacheSpec(kind=kind, remote=acl_redis.url, credentials_file=str(secret))
        config = cache.resolve_cache(spec, dir=tmp_path / f"local-{builder}")
        session = cache.open_session(replace(config, basedir=tmp_path), environ)
        try:
            assert session.warnings == (), "the credentials were taken: no local-only fallback"
            assert session.config.remote == acl_redis.url
            env = {**environ, **session.public_env, **session.secret_env}
            subprocess.run(
                [kind, "gcc", "-c", str(source), "-o", str(tmp_path / f"{builder}.o")],
                env=env,
                cwd=tmp_path,
                check=True,
                capture_output=True,
            )
        finally:
            stats = session.close()
        assert stats is not None
        found.append(stats)
    assert found[0].misses == 1 and found[0].errors == 0, found[0]
    assert found[1].hits == 1 and found[1].remote_hits == 1, found[1]
    keys = subprocess.run(
        [
            "redis-cli",
            "-p",
            str(acl_redis.port),
            "--user",
            ACL_USER,
            "--pass",
            ACL_PASSWORD,
            "--no-auth-warning",
            "DBSIZE",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(keys.stdout.strip()) > 0, "the objects are in Redis, written as the ACL user"
