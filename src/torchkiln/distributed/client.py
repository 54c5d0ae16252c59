"""The build's side of distributed compiles: sccache's client config, its variable, and the preflight.

sccache reads its distributed-compile settings only from its config file (``[dist]`` in the file that
``SCCACHE_CONF`` names; sccache's config.rs has no environment variables for them), and the token is one of
those settings. So the file is written at run time, into a private directory, mode 0600, and removed when the
build ends (:func:`prepare_client` / :func:`finish_client`); what a plan shows is only ``SCCACHE_CONF``.
The local sccache server reads the file once, when it starts: it must be started with ``SCCACHE_CONF`` set.

Why torchkiln checks the scheduler before a build (:func:`preflight`), measured against sccache 0.16.0:

* scheduler unreachable: sccache compiles locally without a word and retries every 30 s;
* token refused: sccache FAILS every compile ("http error status: Error 401"): a 4xx answer is an
  ``HttpClientError``, which sccache's ``dist_or_local_compile`` does not fall back from;
* a build server gone (or dying mid-compile): sccache falls back to a local compile for that one job and
  counts it in ``dist_errors`` (see :mod:`.stats`).

So before the build: reachable and token accepted, or ONE warning and a build without distribution (the
config is not written, sccache compiles locally and from the cache as it would without a cluster).

Settings written, and why:

* ``rewrite_includes_only = true``: the client sends sources preprocessed with ``-fdirectives-only``
  (macros unexpanded) instead of fully preprocessed. From fully preprocessed text the servers' g++ made
  different objects than a local compile (one more ``nop`` in nvcc's host stubs; other line info under
  ``-g``); with this setting code and data are byte-identical (tests/test_cluster.py), and under ``-g`` the
  debug info records the extra switch ``-fdirectives-only``.
* ``cache_dir``: where the client keeps the toolchains it packages (g++, and for .cu files cudafe++, cicc,
  ptxas: sccache packages each compiler with the shared libraries it loads). Kept between builds, so a
  toolchain is packaged once per compiler, and uploaded once per build server.
* no ``toolchains`` entries: on Linux sccache packages g++ and the CUDA tools itself; explicit
  ``path_override`` archives are for clients on other platforms.
"""

from __future__ import annotations

import json
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from torchkiln.process.secrets import redact

from .spec import ClusterSpec, load_token

TIMEOUT_S = 5.0
CONFIG_NAME = "sccache-client.toml"
DEGRADED = "compiling locally (and from the cache), this build will be slower"


@dataclass(frozen=True)
class SchedulerStatus:
    """The scheduler's view of the cluster (``GET /api/v1/scheduler/status``)."""

    num_servers: int
    num_cpus: int
    in_progress: int


class SchedulerUnavailable(Exception):
    """The scheduler cannot be used; the message is one line for the user (no secrets in it)."""


@dataclass(frozen=True)
class Preflight:
    """The result of checking a scheduler before a build."""

    status: SchedulerStatus | None
    problem: str | None  # why distributed compiles cannot be used; None when they can
    notes: tuple[str, ...] = ()  # usable, but worth a warning (no build server registered yet)

    @property
    def usable(self) -> bool:
        return self.problem is None

    @property
    def warning(self) -> str | None:
        """The one warning for the build log, or None."""
        if self.problem is not None:
            return f"{self.problem}: {DEGRADED}"
        return "; ".join(self.notes) or None


def _open(request: urllib.request.Request, timeout: float) -> Any:  # an HTTP response (a context manager)
    return urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 - http(s) only (spec checked)


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", exc)
    return str(getattr(reason, "strerror", None) or reason)


def fetch_status(spec: ClusterSpec, timeout: float = TIMEOUT_S) -> SchedulerStatus:
    """The scheduler's status; SchedulerUnavailable saying why not (unreachable, not a scheduler)."""
    shown = redact(spec.scheduler_url)
    request = urllib.request.Request(
        spec.endpoint("api/v1/scheduler/status"), headers={"Accept": "application/json"}
    )
    try:
        with _open(request, timeout) as response:
            body = response.read(65536)
    except urllib.error.HTTPError as exc:
        raise SchedulerUnavailable(
            f"distributed compiles: scheduler {shown} answered HTTP {exc.code}"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        raise SchedulerUnavailable(
            f"distributed compiles: scheduler {shown} is unreachable ({_reason(exc)})"
        ) from None
    try:
        doc = json.loads(body)
        return SchedulerStatus(int(doc["num_servers"]), int(doc["num_cpus"]), int(doc["in_progress"]))
    except (ValueError, KeyError, TypeError):
        raise SchedulerUnavailable(
            f"distributed compiles: {shown} did not answer like an sccache-dist scheduler"
        ) from None


def check_token(spec: ClusterSpec, token: str, timeout: float = TIMEOUT_S) -> str | None:
    """Why the scheduler will not take ``token`` from clients, or None when it does.

    ``POST /api/v1/scheduler/alloc_job`` with the token and no body: the scheduler checks the bearer token
    before it reads the body, so it answers 401 to a wrong token and 400 (no job requested) to a right one.
    Nothing is allocated either way.
    """
    shown = redact(spec.scheduler_url)
    request = urllib.request.Request(
        spec.endpoint("api/v1/scheduler/alloc_job"),
        data=b"",
        method="POST",
        headers={"Authorization": f"Bearer {token}"},
    )
    try:
        with _open(request, timeout):
            return None  # 2xx: a proxy that accepts anything; the compiles will tell
    except urllib.error.HTTPError as exc:
        if exc.code == 400:
            return None
        detail = exc.read(200).decode("utf-8", "replace").strip()
        detail = redact(detail, [token])
        if exc.code in (401, 403):
            detail = detail or str(exc.reason)
            return f"distributed compiles: scheduler {shown} refuses the token (HTTP {exc.code}: {detail})"
        return f"distributed compiles: scheduler {shown} answered HTTP {exc.code} to the token check"
    except (urllib.error.URLError, OSError) as exc:
        return f"distributed compiles: scheduler {shown} is unreachable ({_reason(exc)})"


def preflight(spec: ClusterSpec, environ: Mapping[str, str], timeout: float = TIMEOUT_S) -> Preflight:
    """Check the scheduler before a build: reachable, an sccache-dist scheduler, and the token accepted.

    UsageError (from :func:`~.spec.load_token`) when the token source is missing: a build told to use a
    cluster should not quietly skip it. A scheduler without build servers is usable (servers may register
    during the build; until then every compile falls back locally) but gives a note.
    """
    return check_scheduler(spec, load_token(spec, environ), timeout)


def check_scheduler(spec: ClusterSpec, token: str, timeout: float = TIMEOUT_S) -> Preflight:
    """:func:`preflight` with the token already loaded."""
    try:
        status = fetch_status(spec, timeout)
    except SchedulerUnavailable as exc:
        return Preflight(None, str(exc))
    problem = check_token(spec, token, timeout)
    if problem is not None:
        return Preflight(status, problem)
    notes: tuple[str, ...] = ()
    if status.num_servers == 0:
        notes = (
            f"distributed compiles: scheduler {redact(spec.scheduler_url)} has no build server yet: "
            "compiles run locally until one registers",
        )
    return Preflight(status, None, notes)


def client_config(spec: ClusterSpec, token: str, toolchain_dir: Path) -> str:
    """The sccache client config (TOML) for ``spec``. It holds the token: never print or store it."""
    return tomli_w.dumps(
        {
            "dist": {
                "scheduler_url": spec.scheduler_url,
                "cache_dir": str(toolchain_dir),
                "rewrite_includes_only": True,
                "auth": {"type": spec.auth, "token": token},
            },
        }
    )


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by the owner only, atomically (temp file + rename).

    The file is created 0600 before anything is written to it, so a secret is never readable by others,
    not even for a moment; the directory is created 0700.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mkstemp: mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def client_env(conf_path: Path) -> dict[str, str]:
    """The variables a build step gets for distributed compiles: what ``torchkiln plan`` may print.

    Only ``SCCACHE_CONF``: everything else is in the file, and the cache variables come from the sccache
    tool's public layer (:meth:`torchkiln.cache.sccache.Sccache.public_env`). ``SCCACHE_CONF`` also keeps a
    user's ``~/.config/sccache/config`` out of the build.
    """
    return {"SCCACHE_CONF": str(conf_path)}


def default_toolchain_dir(cache_dir: Path) -> Path:
    """Where packaged toolchains are kept: beside the sccache cache (``<dir>-dist-toolchains``), so they
    outlive one build. Not inside it: sccache's disk cache counts every file under its directory against
    its size limit and evicts the oldest, which would take 30-80 MiB toolchain packages with it."""
    cache_dir = Path(cache_dir)
    return cache_dir.with_name(f"{cache_dir.name}-dist-toolchains")


def cluster_jobs(local_jobs: int, status: SchedulerStatus | None) -> int:
    """Parallel compile jobs for a distributed build: the local ones plus one per cluster core.

    The scheduler gives each server at most ``cores + 1 + cores/8`` jobs (sccache-dist's ``load_weight``)
    and turns away the rest, which then compile locally; one job per core keeps the cluster busy without
    that. Remote jobs cost the local machine only preprocessing and packaging, not compile memory.
    """
    return local_jobs + (status.num_cpus if status else 0)


@dataclass(frozen=True)
class PreparedClient:
    """What a build needs for distributed compiles at run time (see :func:`prepare_client`)."""

    spec: ClusterSpec | None  # None: not used for this build (off, or the preflight failed)
    env: dict[str, str]  # for the process environment: SCCACHE_CONF (the sccache server must start with it)
    shown_env: dict[str, str]  # safe to print and store (the same: the secret is in the file)
    warnings: tuple[str, ...]
    secrets: tuple[str, ...]
    status: SchedulerStatus | None = None
    conf_path: Path | None = None
    requested: ClusterSpec | None = None  # what was asked for, used or not

    def redact(self, text: str) -> str:
        return redact(text, self.secrets)


def prepare_client(
    spec: ClusterSpec | None,
    environ: Mapping[str, str],
    *,
    run_dir: Path,
    toolchain_dir: Path,
    timeout: float = TIMEOUT_S,
) -> PreparedClient:
    """Preflight the scheduler and write the client config for one build.

    ``run_dir`` is private to this build (the token lands in it; use a fresh temporary directory);
    ``toolchain_dir`` is kept between builds (:func:`default_toolchain_dir`). When the preflight fails the
    result has no env and one warning: the build compiles locally.
    """
    if spec is None:
        return PreparedClient(None, {}, {}, (), ())
    token = load_token(spec, environ)
    check = check_scheduler(spec, token, timeout)
    warnings = (check.warning,) if check.warning else ()
    if not check.usable:
        return PreparedClient(None, {}, {}, warnings, (token,), check.status, None, spec)
    toolchain_dir.mkdir(parents=True, exist_ok=True)
    conf = Path(run_dir) / CONFIG_NAME
    write_private(conf, client_config(spec, token, toolchain_dir))
    env = client_env(conf)
    return PreparedClient(spec, env, dict(env), warnings, (token,), check.status, conf, spec)


def finish_client(prepared: PreparedClient) -> None:
    """Remove the client config (and with it the token) once the build's sccache server has stopped."""
    if prepared.conf_path is not None:
        prepared.conf_path.unlink(missing_ok=True)
