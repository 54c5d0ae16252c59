"""ccache in front of every C, C++ and CUDA compile, with an optional Redis or HTTP remote store.

Why each variable (checked against real builds on torch 2.13.0):

* torch's CMake build: ``CMAKE_{C,CXX,CUDA}_COMPILER_LAUNCHER`` (CMake reads them from the environment, and
  PyTorch's build forwards every ``CMAKE_*`` variable as a cache entry); ``USE_CCACHE=1`` is PyTorch's own
  switch. ``CMAKE_CUDA_USE_RESPONSE_FILE_FOR_{INCLUDES,LIBRARIES,OBJECTS}=OFF``: CMake otherwise hands nvcc
  ``--options-file`` response files, which a cache cannot hash ("multiple input files", pytorch PR #106811).
* ``torch.utils.cpp_extension`` (torchvision, extensions) puts ccache in front by itself when it is on PATH.
* Sharing between machines: ``CCACHE_BASEDIR`` makes absolute paths under the build directory relative and
  ``CCACHE_NOHASHDIR=1`` keeps the working directory out of the hash (Python's sysconfig flags contain
  ``-g``, which otherwise makes ccache hash the cwd); ``CCACHE_COMPILERCHECK=content`` identifies the
  compiler by its bytes, not its mtime, which differs between machines that installed the same compiler.
* The remote store is ``CCACHE_REMOTE_STORAGE``, a URL; ccache takes credentials only inside it (from its
  environment or its configuration file, either readable by every process of the compile step). A Redis
  store is therefore reached through torchkiln (:mod:`.broker`, where ccache has ``redis+unix`` storage):
  the compiles get a Unix socket and no credentials, and need no network. An HTTP store's URL with
  credentials goes into the compiles' environment (a secret variable): the one case where the compile
  step's processes can read a cache credential (docs/supply-chain.md, "Isolation and secrets").
* Statistics per build: ``CCACHE_STATSLOG`` points each build at a log of its own, where every ccache call
  appends the counters it incremented; the cache directory's counters (``--print-stats``) are shared by all
  builds using the directory, and zeroing them would wipe another build's figures.
"""

from __future__ import annotations

import functools
import os
import re
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path

from torchkiln.errors import TorchkilnError, UsageError
from torchkiln.process import runner
from torchkiln.process.isolation import Sandbox
from torchkiln.process.runner import Redact

from .broker import RedisBroker, redis_broker
from .config import CacheConfig
from .remote import Remote, login, parse_remote
from .stats import CacheStats
from .syntax import path_problem
from .tool import CacheTool, cmake_launchers

# ccache 4.7 counters (``ccache --print-stats``) that mean "a compile the cache could not handle": counted
# against the hit rate, since they are exactly the silent not-caching that a gate must catch.
UNCACHEABLE = (
    "could_not_use_modules",
    "could_not_use_precompiled_header",
    "multiple_source_files",
    "output_to_stdout",
    "unsupported_code_directive",
    "unsupported_compiler_option",
    "unsupported_environment_variable",
    "unsupported_source_language",
)
ERRORS = ("remote_storage_error", "remote_storage_timeout", "internal_error", "missing_cache_file")
STATSLOG_PREFIX = "torchkiln-ccache-stats-"
# What a secret may hold to go into CCACHE_REMOTE_STORAGE's URL as written: ccache's redis storage does not
# percent-decode the user info (v4.7.5 src/storage/remote/RedisStorage.cpp split_user_info), and expands
# $VAR in the whole value (torchkiln.cache.syntax): no '$', no URL delimiters.
_URL_SAFE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!&'()*+,;=")


def storage_url(remote: Remote, user: str | None, password: str | None) -> str:
    """``CCACHE_REMOTE_STORAGE``: ccache takes credentials only inside the URL."""
    netloc = remote.netloc
    if password is not None:
        if not set(password) <= _URL_SAFE or (user and not set(user) <= _URL_SAFE):
            raise UsageError(
                "cache.credentials: the secret holds characters ccache cannot take in a URL (it expands "
                "$VAR, and does not decode %XX) (valid: letters, digits and -._~!&'()*+,;=)"
            )
        netloc = f"{user}:{password}@{netloc}" if user else f"{password}@{netloc}"
    return f"{remote.scheme}://{netloc}{remote.path}"


# How ccache prints a size (``ccache -k max_size``, ``--show-stats``): 4.7 ``20.0G``, ``21.5G`` (a binary size
# in decimal units), ``100000`` (bytes, under a megabyte); 4.10 and later ``20.0 GB``, ``20.0 GiB``,
# ``100.0 kB`` (Debian 12 has 4.7.5, Debian 13 4.11.2: both read by real ccache in tests/test_values_to_tools.py).
PRINTED_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kKMGT])(i?)B?)?\s*$")


def parse_printed_size(text: str) -> tuple[float, float]:
    """(bytes, precision) of a size ccache printed, in either form: the precision is half its last digit's
    worth (``20.0 GB`` is 20e9 give or take 5e7), so a caller compares within it."""
    match = PRINTED_SIZE.match(text)
    if match is None:
        raise TorchkilnError(f"ccache printed {text.strip()[:40]!r}, not a size (ccache 4.x is required)")
    number, unit, binary = match.groups()
    scale = float((1024 if binary else 1000) ** " KMGT".index((unit or " ").upper()))
    digits = len(number.partition(".")[2])
    return float(number) * scale, 0.5 * scale / 10**digits


def parse_stats(text: str) -> CacheStats:
    """``ccache --print-stats`` (ccache >= 4.x: ``key<TAB>value`` lines): the whole cache directory's
    counters, what ``torchkiln cache stats`` shows."""
    counters: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("\t")
        if sep and value.strip().lstrip("-").isdigit():
            counters[key.strip()] = int(value)
    if not counters:
        raise TorchkilnError("ccache --print-stats printed no counters (ccache 4.x is required)")
    return _from_counters(counters)


def parse_stats_log(text: str) -> CacheStats:
    """A ``CCACHE_STATSLOG`` file: for each ccache call a ``# <source>`` line, then one line per counter it
    increments (the same names as ``--print-stats``). A build's own log counts that build's compiles only,
    whatever other builds do in the same cache directory meanwhile."""
    counters: dict[str, int] = {}
    for line in text.splitlines():
        name = line.strip()
        if name and not name.startswith("#"):
            counters[name] = counters.get(name, 0) + 1
    return _from_counters(counters)


def _from_counters(counters: Mapping[str, int]) -> CacheStats:
    c = counters.get
    return CacheStats(
        tool="ccache",
        hits=c("direct_cache_hit", 0) + c("preprocessed_cache_hit", 0),
        misses=c("cache_miss", 0),
        uncacheable=sum(c(k, 0) for k in UNCACHEABLE),
        local_hits=c("local_storage_hit", 0),
        local_misses=c("local_storage_miss", 0),
        remote_hits=c("remote_storage_hit", 0),
        remote_misses=c("remote_storage_miss", 0),
        errors=sum(c(k, 0) for k in ERRORS),
    )


@functools.cache
def _has_unix_redis(executable: str | None) -> bool:
    """Whether this ccache reaches a Redis store on a Unix socket (``redis+unix-storage`` among the
    features ``ccache --version`` lists, ccache 4.7+)."""
    if executable is None:
        return False
    try:
        done = runner.run([executable, "--version"], timeout=30)
    except runner.ProcessError:
        return False
    return "redis+unix-storage" in done.stdout


class Ccache(CacheTool):
    kind = "ccache"
    schemes = ("redis", "http")
    scheme_hint = " (s3://, gs://, memcached://, webdav+https:// need sccache)"

    def _remote(self, config: CacheConfig) -> Remote | None:
        if not config.remote:
            return None
        return parse_remote(config.remote, kind=self.kind, schemes=self.schemes, hint=self.scheme_hint)

    def public_env(self, config: CacheConfig) -> dict[str, str]:
        env = {
            **cmake_launchers("ccache"),
            "USE_CCACHE": "1",
            "CCACHE_DIR": str(config.dir),
            "CCACHE_COMPILERCHECK": "content",
            "CCACHE_NOHASHDIR": "1",
        }
        if config.max_size:
            env["CCACHE_MAXSIZE"] = config.max_size
        remote = self._remote(config)
        if remote is not None and not config.has_credentials:
            env["CCACHE_REMOTE_STORAGE"] = storage_url(remote, remote.user, None)
        if config.basedir is not None:
            env["CCACHE_BASEDIR"] = str(config.basedir)
        return env

    def secret_env(self, config: CacheConfig, environ: Mapping[str, str]) -> dict[str, str]:
        remote = self._remote(config)
        if remote is None or not config.has_credentials:
            return {}
        user, password = login(config, remote, environ)
        return {"CCACHE_REMOTE_STORAGE": storage_url(remote, user, password)}

    def broker(self, config: CacheConfig, environ: Mapping[str, str]) -> RedisBroker | None:
        """A Redis store through torchkiln's broker, when this ccache can reach a Unix socket (4.7+)."""
        usable = lambda: _has_unix_redis(self.executable(environ))  # noqa: E731
        return redis_broker(config, self._remote(config), environ, "ccache", usable)

    def through(
        self, broker: RedisBroker, public: dict[str, str], secret: dict[str, str], server: dict[str, str]
    ) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
        """``CCACHE_REMOTE_STORAGE`` is the broker's socket (public: no credentials in it)."""
        secret = {k: v for k, v in secret.items() if k != "CCACHE_REMOTE_STORAGE"}
        return {**public, "CCACHE_REMOTE_STORAGE": broker.url}, secret, server

    def step_paths(self, config: CacheConfig, env: Mapping[str, str]) -> tuple[Path, ...]:
        """The cache directory (ccache writes objects itself), the build's statistics log, the broker's
        socket directory."""
        paths = [config.dir]
        if env.get("CCACHE_STATSLOG"):
            paths.append(Path(env["CCACHE_STATSLOG"]))
        storage = env.get("CCACHE_REMOTE_STORAGE", "")
        if storage.startswith("redis+unix:"):
            paths.append(Path(storage.removeprefix("redis+unix:")).parent)
        return tuple(paths)

    def step_network(self, config: CacheConfig, env: Mapping[str, str]) -> bool:
        """A store not behind the broker (HTTP; Redis with a ccache older than 4.7) is reached by ccache."""
        storage = env.get("CCACHE_REMOTE_STORAGE")
        return bool(config.remote and not (storage or "").startswith("redis+unix:"))

    def run_env(self, config: CacheConfig) -> dict[str, str]:
        """This build's own statistics log (``CCACHE_STATSLOG``): the cache directory's counters are shared
        by every build using it (the default directory by all of a user's builds), this file is not."""
        name = f"{STATSLOG_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}.log"
        log = str(Path(tempfile.gettempdir()) / name)
        problem = path_problem(log, self.kind)  # TMPDIR is the user's: ccache expands $VAR in stats_log
        if problem:
            raise UsageError(f"TMPDIR: {problem} (valid: a temporary directory without '$')")
        return {"CCACHE_STATSLOG": log}

    def start(self, env: Mapping[str, str], redact: Redact, sandbox: Sandbox | None = None) -> str | None:
        log = env.get("CCACHE_STATSLOG")
        if log:
            runner.remove_at_exit(Path(log))  # also when torchkiln is killed (torchkiln.process.supervisor)
        return None

    def stop(self, env: Mapping[str, str], *, now: bool = False) -> None:
        log = env.get("CCACHE_STATSLOG")
        if log:
            Path(log).unlink(missing_ok=True)

    def zero_stats(self, env: Mapping[str, str], redact: Redact) -> None:
        """A build's log starts empty (and exists: a sandboxed compile step gets it mounted); without one
        (``torchkiln cache zero``) the directory's counters."""
        log = env.get("CCACHE_STATSLOG")
        if log:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.close(fd)
            return
        self._output(["ccache", "--zero-stats"], env, redact)

    def max_size_read(self, env: Mapping[str, str], redact: Redact) -> str:
        """What ccache makes of ``CCACHE_MAXSIZE`` in ``env`` (``ccache -k max_size``), as it prints it."""
        return self._output(["ccache", "-k", "max_size"], env, redact).strip()

    def read_stats(self, env: Mapping[str, str], redact: Redact) -> CacheStats:
        """A build's statistics from its own log (none yet: nothing compiled); without one (``torchkiln
        cache stats``) the directory's counters."""
        log = env.get("CCACHE_STATSLOG")
        if log:
            try:
                return parse_stats_log(Path(log).read_text(encoding="utf-8", errors="replace"))
            except FileNotFoundError:
                return parse_stats_log("")
        return parse_stats(self._output(["ccache", "--print-stats"], env, redact))
