"""A build's compiler cache at run time: its session, opened before the first compile that runs and closed by
publish (or when the build stops), and distributed compiles when the plan has a scheduler.

One per build (:class:`~torchkiln.build.context.BuildSetup` holds it): it keeps the variables secrets are
read from apart from the environment every step composes its own from, and hands them only to the cache
session, its server and broker, and the cluster's client config.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from torchkiln.cache import CacheSession, CacheStats, open_session
from torchkiln.distributed.stats import ClusterStats
from torchkiln.errors import TorchkilnError
from torchkiln.plan.model import Plan, Step
from torchkiln.process.environ import compose

from .sandbox import server_sandbox

if TYPE_CHECKING:
    from torchkiln.distributed.client import PreparedClient  # the client only by a build with a scheduler

    from .context import BuildRecord, BuildSetup


class CompilerCache:
    """The cache session of one build, and what it found: its statistics, where its compiles ran."""

    def __init__(self, plan: Plan, held: Mapping[str, str]) -> None:
        self.plan = plan
        self._held = dict(held)  # the variables secrets are read from, never in a step's environment
        self.session: CacheSession | None = None
        self.stats: CacheStats | None = None  # this run's, once the session closed
        self.client: PreparedClient | None = None  # distributed compiles, once the session opened
        self.cluster_env: dict[str, str] = {}  # compile steps' run-time layer for them
        # What the sccache server alone starts with for them: SCCACHE_CONF, the client config holding the token.
        self.cluster_server_env: dict[str, str] = {}
        self.cluster_stats: ClusterStats | None = (
            None  # where this run's compiles ran, once the session closed
        )

    def redact(self, text: str) -> str:
        if self.client is not None:
            text = self.client.redact(text)
        return self.session.redact(text) if self.session is not None else text

    def open(self, step: Step, setup: BuildSetup, record: BuildRecord) -> CacheSession:
        """Before the first compile that runs: tool present, remote usable (else one warning), stats zeroed.

        With distributed compiles the scheduler is checked first (unreachable or refusing the token: one
        warning, compiles run locally) and the sccache server starts with the client config (SCCACHE_CONF),
        a private file that holds the token and is removed when the server stops."""
        if self.session is None:
            tool_environ = compose(setup.environ, step.env, path_prepend=step.path_prepend)
            self._prepare_cluster(tool_environ, setup, record)
            cache_secret = {k: v for k, v in self._held.items() if k == self.plan.cache.credentials_env}
            self.session = open_session(
                self.plan.cache,
                {**tool_environ, **cache_secret},  # the session reads it; its tool does not get the variable
                extra_env=self.cluster_server_env,
                sandbox=server_sandbox(setup, record),
            )
            if self.client is not None and self.client.conf_path is not None:
                # sccache read its client config (the token) once, when its server started: emptied now, the
                # token lives in that server's memory only, not in a file the compiles it runs could read
                os.truncate(self.client.conf_path, 0)
            for warning in self.session.warnings:
                record.warn(warning)
        return self.session

    def _prepare_cluster(self, environ: dict[str, str], setup: BuildSetup, record: BuildRecord) -> None:
        spec = self.plan.cluster
        if spec is None:
            return
        from torchkiln.distributed.client import (  # noqa: PLC0415 - only a build with a scheduler
            cluster_jobs,
            default_toolchain_dir,
            prepare_client,
        )

        run_dir = Path(tempfile.mkdtemp(prefix="torchkiln-cluster-"))  # 0700: the token lands in it
        self.client = prepare_client(
            spec,
            {**environ, **self._held},
            run_dir=run_dir,
            toolchain_dir=default_toolchain_dir(self.plan.cache.dir),
        )
        for warning in self.client.warnings:
            record.warn(self.client.redact(warning))
        if self.client.spec is None:  # the preflight failed: local compiles
            shutil.rmtree(run_dir, ignore_errors=True)
            return
        self.cluster_server_env = dict(self.client.env)  # the server's alone: the compiles are its clients
        if self.plan.jobs.source == "auto" and self.client.status is not None:
            # Remote compiles cost this machine preprocessing only: one job per core of the cluster too.
            jobs = str(cluster_jobs(self.plan.jobs.value, self.client.status))
            self.cluster_env.update({"MAX_JOBS": jobs, "CMAKE_BUILD_PARALLEL_LEVEL": jobs})
            setup.display.note(
                f"distributed compiles: {self.client.status.num_servers} build servers, "
                f"{self.client.status.num_cpus} cores at {spec.scheduler_url}; MAX_JOBS={jobs}"
            )

    def close(self, setup: BuildSetup, record: BuildRecord) -> None:
        """This run's statistics; stops what the cache tool started for the build (its sccache server)."""
        if self.session is None or self.session.closed:
            return
        try:
            stats = self.session.close()
        except TorchkilnError as exc:
            record.add_warning(f"compiler cache statistics unavailable: {exc}")
            return
        finally:
            if self.client is not None:
                self._finish_cluster()
        self.stats = stats
        if stats is not None:
            setup.display.note(f"compiler cache: {stats.summary()}")
        if stats is not None and self.client is not None and self.client.spec is not None:
            self.cluster_stats = stats.cluster  # read with the cache's counters, before the server stopped
        if self.cluster_stats is not None:
            setup.display.note(self.cluster_stats.summary())
            fallback = self.cluster_stats.fallback_warning()
            if fallback:
                record.warn(fallback)

    def _finish_cluster(self) -> None:
        """The client config (and the token in it) removed once the server that read it has stopped."""
        assert self.client is not None
        from torchkiln.distributed.client import finish_client  # noqa: PLC0415 - see _prepare_cluster

        finish_client(self.client)
        if self.client.conf_path is not None:
            shutil.rmtree(self.client.conf_path.parent, ignore_errors=True)
