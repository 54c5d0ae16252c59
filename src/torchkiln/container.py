"""Container engines: one build request, the argv each engine needs for it.

Like cibuildwheel's engine layer, torchkiln does not care which tool builds an image: ``docker buildx``
when a Docker engine answers, otherwise ``buildah`` (daemonless; works as root in CI with
``--isolation chroot --storage-driver vfs``). A :class:`BuildRequest` says what to build; an engine turns
it into an argv list (never a shell string: recipe values are arguments, not code). ``--print`` shows that
argv, so the exact command is always inspectable.
"""

from __future__ import annotations

import shutil
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .errors import TorchkilnError, UsageError

ENGINES = ("docker", "buildah")


@dataclass(frozen=True)
class BuildRequest:
    dockerfile: Path
    context: Path
    target: str
    tags: tuple[str, ...]
    build_args: Mapping[str, str]
    named_contexts: Mapping[str, Path] = field(default_factory=dict)
    secrets: Mapping[str, Path] = field(default_factory=dict)  # id -> file holding the secret
    labels: Mapping[str, str] = field(default_factory=dict)
    pull: bool = True  # False: only use base images already in local storage


@dataclass(frozen=True)
class Storage:
    """Where buildah keeps images: its defaults, or a private root (tests, CI scratch space)."""

    root: Path | None = None
    runroot: Path | None = None
    driver: str | None = None

    def args(self) -> list[str]:
        out: list[str] = []
        if self.root:
            out += ["--root", str(self.root)]
        if self.runroot:
            out += ["--runroot", str(self.runroot)]
        if self.driver:
            out += ["--storage-driver", self.driver]
        return out


def _kv(flag: str, values: Mapping[str, object]) -> list[str]:
    out: list[str] = []
    for key, value in values.items():
        out += [flag, f"{key}={value}"]
    return out


class Engine(ABC):
    name = ""

    @abstractmethod
    def build_argv(self, req: BuildRequest) -> list[str]:
        """The argv that builds ``req``."""

    @staticmethod
    def request_args(req: BuildRequest) -> list[str]:
        """The options docker buildx build and buildah bud spell alike: file, target, tags, build args,
        labels, named contexts and secrets (passed as files, never as values)."""
        argv = ["--file", str(req.dockerfile), "--target", req.target]
        for tag in req.tags:
            argv += ["--tag", tag]
        argv += _kv("--build-arg", req.build_args)
        argv += _kv("--label", req.labels)
        argv += _kv("--build-context", req.named_contexts)
        for secret_id, path in req.secrets.items():
            argv += ["--secret", f"id={secret_id},src={path}"]
        return argv


@dataclass(frozen=True)
class Docker(Engine):
    """``docker buildx build --load``: BuildKit (cache mounts, secrets, named contexts)."""

    executable: str = "docker"
    name = "docker"

    def build_argv(self, req: BuildRequest) -> list[str]:
        argv = [self.executable, "buildx", "build", *self.request_args(req)]
        if req.pull:
            argv.append("--pull")
        argv += ["--load", str(req.context)]
        return argv

    def run_argv(
        self,
        image: str,
        command: Sequence[str],
        *,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        mounts: Mapping[Path, str] | None = None,
    ) -> list[str]:
        argv = [self.executable, "run", "--rm"]
        if user:
            argv += ["--user", user]
        argv += _run_options(env, mounts)
        return [*argv, image, *command]


@dataclass(frozen=True)
class Buildah(Engine):
    """``buildah bud``: no daemon. Without ``--layers`` each stage is committed once, which keeps vfs
    storage (a full copy per layer) affordable. Docker image format, like ``docker build``: OCI's has no
    SHELL, so ``SHELL [bash, -o, pipefail]`` would be dropped."""

    executable: str = "buildah"
    storage: Storage = field(default_factory=Storage)
    isolation: str = "chroot"
    name = "buildah"

    def build_argv(self, req: BuildRequest) -> list[str]:
        argv = [
            self.executable,
            *self.storage.args(),
            "bud",
            "--format",
            "docker",
            "--isolation",
            self.isolation,
            "--network",
            "host",
            *self.request_args(req),
        ]
        argv.append("--pull=true" if req.pull else "--pull=never")
        argv.append(str(req.context))
        return argv

    def storage_argv(self, *args: str) -> list[str]:
        return [self.executable, *self.storage.args(), *args]


def _run_options(env: Mapping[str, str] | None, mounts: Mapping[Path, str] | None) -> list[str]:
    """--env and read-only --volume options, spelled alike by docker run and buildah run."""
    argv: list[str] = []
    for key, value in (env or {}).items():
        argv += ["--env", f"{key}={value}"]
    for host, target in (mounts or {}).items():
        argv += ["--volume", f"{Path(host).resolve()}:{target}:ro"]
    return argv


def _docker_usable(executable: str) -> bool:
    """A docker CLI with buildx *and* a reachable engine (a CLI alone cannot build)."""
    try:
        for argv in ([executable, "buildx", "version"], [executable, "info", "--format", "{{.ID}}"]):
            done = subprocess.run(argv, capture_output=True, timeout=20, check=False)
            if done.returncode != 0:
                return False
    except (OSError, subprocess.TimeoutExpired):
        return False
    return True


def select_engine(choice: str = "auto", *, storage: Storage | None = None, for_print: bool = False) -> Engine:
    """The engine to use: ``docker`` if it can build here, else ``buildah``.

    ``choice`` forces one. With ``for_print`` nothing needs to run, so an absent engine is not an error:
    the forced one (or docker, the one users' CI most often has) is returned for showing its command.
    """
    storage = storage or Storage()
    if choice not in ("auto", *ENGINES):
        raise UsageError(f"--engine {choice!r} is not an engine (valid: auto, {', '.join(ENGINES)})")
    docker = shutil.which("docker")
    buildah = shutil.which("buildah")
    if choice == "docker":
        if docker is None and not for_print:
            raise TorchkilnError(
                "--engine docker: no `docker` on PATH (install Docker with buildx, or use buildah)"
            )
        return Docker(docker or "docker")
    if choice == "buildah":
        if buildah is None and not for_print:
            raise TorchkilnError("--engine buildah: no `buildah` on PATH (apt-get install buildah)")
        return Buildah(buildah or "buildah", storage)
    if docker and _docker_usable(docker):
        return Docker(docker)
    if buildah:
        return Buildah(buildah, storage)
    if for_print:
        return Docker("docker")
    raise TorchkilnError(
        "no container engine: neither a Docker engine with buildx nor buildah is usable here "
        "(install one; CI: apt-get install buildah)"
    )


def run_in_image(
    engine: Engine,
    image: str,
    command: Sequence[str],
    *,
    user: str | None = None,
    env: Mapping[str, str] | None = None,
    mounts: Mapping[Path, str] | None = None,
    capture: bool = False,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in a fresh container of ``image`` as ``user`` (the image's USER when None), with
    ``env`` set and ``mounts`` (host path -> container path) bound read-only. Output goes to our
    stdout/stderr, or is returned with ``capture``. The container is always removed."""
    if isinstance(engine, Docker):
        argv = engine.run_argv(image, command, user=user, env=env, mounts=mounts)
        return subprocess.run(argv, check=False, capture_output=capture, text=True, timeout=timeout)
    assert isinstance(engine, Buildah)
    created = subprocess.run(
        engine.storage_argv("from", "--pull=false", image), capture_output=True, text=True, check=False
    )
    if created.returncode != 0:
        raise TorchkilnError(f"buildah from {image} failed: {created.stderr.strip()}")
    container = created.stdout.strip().splitlines()[-1]
    try:
        # chroot isolation names the container after its id but puts no such line in /etc/hosts; torchrun
        # (the verify suite's DDP checks) resolves its own hostname, so use one that resolves.
        argv = engine.storage_argv("run", "--isolation", engine.isolation, "--hostname", "localhost")
        if user:
            argv += ["--user", user]
        argv += _run_options(env, mounts)
        return subprocess.run(
            [*argv, container, "--", *command],
            check=False,
            capture_output=capture,
            text=True,
            timeout=timeout,
        )
    finally:
        subprocess.run(engine.storage_argv("rm", container), capture_output=True, check=False)


def image_user(engine: Engine, image: str) -> str:
    """The image config's default user ('' for root)."""
    if isinstance(engine, Docker):
        argv = [engine.executable, "image", "inspect", "--format", "{{.Config.User}}", image]
    else:
        assert isinstance(engine, Buildah)
        argv = engine.storage_argv("inspect", "--type", "image", "--format", "{{.OCIv1.Config.User}}", image)
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise TorchkilnError(f"cannot inspect {image}: {done.stderr.strip()}")
    return done.stdout.strip()
