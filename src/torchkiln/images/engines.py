"""Container engines: docker (BuildKit, through ``docker buildx``), podman and buildah, one class each.

Callers say *what* to build (a :class:`BuildRequest`) or run; the engine's class says how its command line
spells it, so nothing outside this module asks which engine it holds (the model is cibuildwheel's
``OCIContainer``, which keeps docker's and podman's differences inside one class). Every command goes
through :mod:`torchkiln.process.runner`: argv lists only (recipe values are arguments, never shell code), a process
group each. ``torchkiln images --print`` shows the build argv, so the exact command is always inspectable.

Where the three differ (everything else, the options of :meth:`BuildRequest.args`, they spell alike):

=============  =================================  =======================================  ==================================
               docker                             podman                                   buildah
=============  =================================  =======================================  ==================================
build          ``buildx build``, ``--load``       ``build`` (the image lands in its        ``bud`` (likewise)
               (``--output`` exports instead)     storage; ``--output`` exports instead)
isolation      BuildKit's own                     ``--isolation chroot --network host``:   the same
                                                  no OCI runtime needed for RUN steps
pull           ``--pull``, or nothing             ``--pull=always`` / ``--pull=never``     ``--pull=true`` / ``--pull=never``
storage        the daemon's (none to choose)      ``--root --runroot --storage-driver``    the same
run            ``run --rm``                       ``run --rm``                             ``from``, ``run``, ``rm``
image config   ``image inspect``: ``Config``      ``image inspect``: ``Config``            ``inspect --type image``:
                                                                                           ``Docker.config``
size           ``Size`` (bytes)                   ``Size`` (bytes)                         ``images --json``: "1.27 GB"
exists         ``image inspect`` succeeds         ``image exists``                         ``inspect --type image`` succeeds
remove         ``image rm --force``               ``rmi --force``                          ``rmi --force``
=============  =================================  =======================================  ==================================

A new engine is a subclass here and a row in :data:`ENGINES`.
"""

from __future__ import annotations

import json
import re
import shutil
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from torchkiln.errors import TorchkilnError, UsageError
from torchkiln.process import runner

PROBE_TIMEOUT_S = 20


@dataclass(frozen=True)
class BuildRequest:
    """What to build, in terms every engine understands."""

    dockerfile: Path
    context: Path
    target: str  # the stage; "" for a single-stage file
    tags: tuple[str, ...]
    build_args: Mapping[str, str]
    named_contexts: Mapping[str, Path] = field(default_factory=dict)
    secrets: Mapping[str, Path] = field(default_factory=dict)  # id -> file holding the secret
    labels: Mapping[str, str] = field(default_factory=dict)
    pull: bool = True  # False: only use base images already in local storage
    output: Path | None = None  # export the stage's files into this directory instead of storing an image
    platform: str = ""  # the image's OCI platform (linux/arm64); "" for the engine's own
    # the platform is another machine's: its RUN steps run through qemu-user (HOST_CPUS)
    emulated: bool = False

    def args(self) -> list[str]:
        """The options every engine spells alike: file, platform, target, tags, build args, labels, named
        contexts, secrets (as files, never values) and the local export."""
        argv = ["--file", str(self.dockerfile)]
        if self.platform:
            argv += ["--platform", self.platform]
        if self.target:
            argv += ["--target", self.target]
        for tag in self.tags:
            argv += ["--tag", tag]
        argv += _pairs("--build-arg", self.build_args)
        argv += _pairs("--label", self.labels)
        argv += _pairs("--build-context", self.named_contexts)
        for secret_id, path in self.secrets.items():
            argv += ["--secret", f"id={secret_id},src={path}"]
        if self.output is not None:
            argv += ["--output", f"type=local,dest={self.output}"]
        return argv


@dataclass(frozen=True)
class RunRequest:
    """What to run in a fresh container (:meth:`Engine.run` says what each part means)."""

    image: str
    command: Sequence[str]
    user: str | None = None
    env: Mapping[str, str] | None = None
    mounts: Mapping[Path, str] | None = None
    capture: bool = False
    timeout: float | None = None
    qemu_cpu: str = ""

    def options(self) -> list[str]:
        return _run_options(self.user, self.env, self.mounts)


@dataclass(frozen=True)
class Storage:
    """Where podman or buildah keep images: their defaults, or a private root (tests, CI scratch space)."""

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

    @property
    def chosen(self) -> bool:
        return bool(self.root or self.runroot or self.driver)


@dataclass(frozen=True)
class ImageConfig:
    """What an image's configuration says, whichever engine stored it."""

    user: str  # "" for root
    labels: dict[str, str]


def _pairs(flag: str, values: Mapping[str, object]) -> list[str]:
    out: list[str] = []
    for key, value in values.items():
        out += [flag, f"{key}={value}"]
    return out


def _run_options(
    user: str | None, env: Mapping[str, str] | None, mounts: Mapping[Path, str] | None
) -> list[str]:
    """--user, --env and read-only --volume options, which docker run, podman run and buildah run share."""
    argv = ["--user", user] if user else []
    for key, value in (env or {}).items():
        argv += ["--env", f"{key}={value}"]
    for host, target in (mounts or {}).items():
        source = str(Path(host).resolve())
        if ":" in source or ":" in target or "," in source:  # --volume SOURCE:TARGET:OPTIONS
            raise UsageError(f"{source}: cannot be mounted with --volume, which splits at ':' and ','")
        argv += ["--volume", f"{source}:{target}:ro"]
    return argv


# Under qemu-user an aarch64 torch dies at import (SIGSEGV, after "Can't open MIDR_EL1 sysfs entry") when it
# sees an x86_64 host's CPUs: oneDNN's xbyak_aarch64 lists /sys/devices/system/cpu and reads each CPU's
# regs/identification/midr_el1, which only an Arm kernel has (seen with qemu 7.2 and upstream's aarch64 2.13.0
# wheel). Without the directory, it and cpuinfo fall back and torch runs. So an emulated run gets an empty
# read-only tmpfs there, mounted as root before the command, which then runs as the user it is for (setpriv).
HOST_CPUS = "/sys/devices/system/cpu"
HIDE_HOST_CPUS = f"mount -t tmpfs -o ro,size=4k kiln-no-host-cpus {HOST_CPUS} || exit 125"


def _without_host_cpus(command: Sequence[str], user: str) -> list[str]:
    """``command`` wrapped so that it runs with :data:`HOST_CPUS` hidden, as ``user`` ("UID:GID", "" for root,
    with the HOME of its passwd entry, as the engine gives a user). The shell script is fixed text and numbers
    checked here: the command's words are its positional arguments, never parsed."""
    script = HIDE_HOST_CPUS + '; exec "$@"'
    if user and user not in ("0", "0:0", "root"):
        uid, _, gid = user.partition(":")
        gid = gid or uid
        if not (uid.isdigit() and gid.isdigit()):
            raise UsageError(f"user {user!r}: an emulated run needs a numeric UID[:GID] (the image's USER)")
        script = (
            f"{HIDE_HOST_CPUS}; home=$(getent passwd {uid} | cut -d: -f6); "
            f'exec setpriv --reuid={uid} --regid={gid} --clear-groups -- env "HOME=${{home:-/}}" "$@"'
        )
    return ["sh", "-c", script, "sh", *command]


class Engine(ABC):
    """A container engine: how it builds, runs and inspects images."""

    name: ClassVar[str] = ""
    install_hint: ClassVar[str] = ""
    private_storage: ClassVar[bool] = False  # images in a storage of torchkiln's choosing (Storage)
    # whether RUN steps run on this host (buildah, podman), not in a daemon that may be elsewhere (docker)
    builds_here: ClassVar[bool] = False
    executable: str

    @classmethod
    @abstractmethod
    def create(cls, executable: str, storage: Storage) -> Engine:
        """The engine at ``executable``, keeping images in ``storage`` where it has a storage to choose."""

    @classmethod
    def usable(cls, executable: str) -> bool:
        """Whether the engine can build here (daemonless engines: being installed is enough)."""
        return True

    def command(self, *args: str) -> list[str]:
        """The argv of one of the engine's subcommands, with its global options (storage)."""
        return [self.executable, *args]

    @abstractmethod
    def build_argv(self, req: BuildRequest) -> list[str]:
        """The argv that builds ``req``."""

    def build(self, req: BuildRequest) -> runner.Completed:
        """Build ``req``, its output going to this process's terminal; a failure says which engine failed."""
        done = runner.run(self.build_argv(req), capture=False)
        if not done.ok:
            raise TorchkilnError(
                f"image build failed ({self.name} exit {done.returncode}); its output is above"
            )
        return done

    def run(
        self,
        image: str,
        command: Sequence[str],
        *,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        mounts: Mapping[Path, str] | None = None,
        capture: bool = False,
        timeout: float | None = None,
        qemu_cpu: str = "",
    ) -> runner.Completed:
        """Run ``command`` in a fresh container of ``image`` as ``user`` (the image's USER when None), with
        ``env`` set and ``mounts`` (host path -> container path) bound read-only; the container is removed
        afterwards. Output goes to this process's stdout/stderr, or is returned with ``capture``.
        ``qemu_cpu``: the image is for another machine, run through qemu-user modelling this CPU (QEMU_CPU),
        with the host's CPUs hidden (:data:`HOST_CPUS`)."""
        return self.run_request(RunRequest(image, command, user, env, mounts, capture, timeout, qemu_cpu))

    @abstractmethod
    def run_request(self, req: RunRequest) -> runner.Completed:
        """:meth:`run` ``req``, as this engine's command line spells it."""

    @abstractmethod
    def image_config(self, image: str) -> ImageConfig:
        """The image's user and labels; TorchkilnError when the engine does not know the image."""

    def image_user(self, image: str) -> str:
        return self.image_config(image).user

    @abstractmethod
    def image_size(self, image: str) -> int | None:
        """Bytes of the image as stored (uncompressed layers); None when the engine does not say."""

    @abstractmethod
    def image_exists(self, image: str) -> bool:
        """Whether ``image`` is in the engine's local storage."""

    @abstractmethod
    def remove_image(self, image: str) -> None:
        """Remove ``image`` from local storage (nothing when it is not there)."""

    def _inspect(self, *args: str) -> Any:
        done = runner.run(self.command(*args))
        if not done.ok:
            raise TorchkilnError(
                f"cannot inspect {args[-1]} with {self.name}: {done.first_error() or 'failed'}"
            )
        return json.loads(done.stdout)


# --------------------------------------------------------------------------------------------------
# docker and podman: the same command line, where podman keeps its storage and isolation.
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Docker(Engine):
    """``docker buildx build --load``: BuildKit (cache mounts, secrets, named contexts) and a daemon that
    keeps the images."""

    executable: str = "docker"
    name: ClassVar[str] = "docker"
    install_hint: ClassVar[str] = "install Docker with buildx, or use podman or buildah"

    @classmethod
    def create(cls, executable: str, storage: Storage) -> Engine:
        if storage.chosen:
            raise UsageError(
                "--storage-root/--storage-driver: docker keeps images in its daemon's storage "
                "(valid with --engine podman or buildah)"
            )
        return cls(executable)

    @classmethod
    def usable(cls, executable: str) -> bool:
        """A docker CLI with buildx *and* an engine that answers (a CLI alone cannot build)."""
        for args in (("buildx", "version"), ("info", "--format", "{{.ID}}")):
            try:
                if not runner.run([executable, *args], timeout=PROBE_TIMEOUT_S).ok:
                    return False
            except runner.ProcessError:
                return False
        return True

    def build_words(self) -> list[str]:
        return self.command("buildx", "build")

    def pull_args(self, pull: bool) -> list[str]:
        return ["--pull"] if pull else []

    def store_args(self, req: BuildRequest) -> list[str]:
        """What keeps the result: buildx leaves it in its builder unless loaded into the daemon."""
        return [] if req.output is not None else ["--load"]

    def build_argv(self, req: BuildRequest) -> list[str]:
        return [
            *self.build_words(),
            *req.args(),
            *self.pull_args(req.pull),
            *self.store_args(req),
            "--",
            str(req.context),
        ]

    def run_request(self, req: RunRequest) -> runner.Completed:
        if req.qemu_cpu:
            raise TorchkilnError(
                f"{req.image}: an image for another machine runs here through qemu-user only with the host's "
                f"CPUs hidden from it ({HOST_CPUS}), which torchkiln does with buildah (valid: --engine buildah, "
                "or run it on a machine of its platform)"
            )
        argv = [*self.command("run", "--rm"), *req.options(), "--", req.image, *req.command]
        return runner.run(argv, capture=req.capture, timeout=req.timeout)

    def image_config(self, image: str) -> ImageConfig:
        config = self._inspect("image", "inspect", "--", image)[0].get("Config") or {}
        return ImageConfig(config.get("User") or "", dict(config.get("Labels") or {}))

    def image_size(self, image: str) -> int | None:
        done = runner.run(self.command("image", "inspect", "--", image))
        if not done.ok:
            return None
        size = json.loads(done.stdout)[0].get("Size")
        return size if isinstance(size, int) else None

    def image_exists(self, image: str) -> bool:
        return runner.run(self.command("image", "inspect", "--", image)).ok

    def remove_image(self, image: str) -> None:
        runner.run(self.command("image", "rm", "--force", "--", image))


@dataclass(frozen=True)
class Daemonless(Engine):
    """What podman and buildah share: no daemon, so being installed is enough to build; images in a storage
    of torchkiln's choosing (global options of every command); RUN steps in chroot isolation."""

    executable: str
    storage: Storage = field(default_factory=Storage)
    isolation: str = "chroot"
    private_storage: ClassVar[bool] = True
    builds_here: ClassVar[bool] = True

    @classmethod
    def create(cls, executable: str, storage: Storage) -> Engine:
        return cls(executable, storage)

    @classmethod
    def usable(cls, executable: str) -> bool:
        return True

    def command(self, *args: str) -> list[str]:
        return [self.executable, *self.storage.args(), *args]


@dataclass(frozen=True)
class Podman(Daemonless, Docker):
    """``podman build``: docker's command line without a daemon. Images go to podman's own storage
    (``--root`` etc. to choose it); RUN steps use chroot isolation and the host network like buildah's, so
    no OCI runtime is needed to build (running a container still needs one). Docker image format:
    OCI's has no SHELL, so ``SHELL [bash, -o, pipefail]`` would be dropped."""

    executable: str = "podman"
    name: ClassVar[str] = "podman"
    install_hint: ClassVar[str] = "apt-get install podman"

    def build_words(self) -> list[str]:
        return self.command("build", "--format", "docker", "--isolation", self.isolation, "--network", "host")

    def pull_args(self, pull: bool) -> list[str]:
        return ["--pull=always" if pull else "--pull=never"]

    def store_args(self, req: BuildRequest) -> list[str]:
        return []  # a build without --output commits the image to local storage

    def image_exists(self, image: str) -> bool:
        return runner.run(self.command("image", "exists", "--", image)).ok

    def remove_image(self, image: str) -> None:
        runner.run(self.command("rmi", "--force", "--", image))


# --------------------------------------------------------------------------------------------------
# buildah: no daemon, no `run IMAGE`.
# --------------------------------------------------------------------------------------------------

_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
}


def parse_size(text: str) -> int | None:
    """buildah prints sizes for people ('1.27 GB', decimal units); bytes back (to 3 digits)."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", text)
    if not match:
        return None
    unit = _UNITS.get((match.group(2) or "B").upper())
    return int(float(match.group(1)) * unit) if unit else None


@dataclass(frozen=True)
class Buildah(Daemonless):
    """``buildah bud``: no daemon. Without ``--layers`` each stage is committed once, which keeps vfs
    storage (a full copy per layer) affordable. Docker image format, like ``docker build``: OCI's has no
    SHELL, so ``SHELL [bash, -o, pipefail]`` would be dropped."""

    executable: str = "buildah"
    name: ClassVar[str] = "buildah"
    install_hint: ClassVar[str] = "apt-get install buildah"

    def build_argv(self, req: BuildRequest) -> list[str]:
        return [
            *self.command("bud", "--format", "docker", "--isolation", self.isolation, "--network", "host"),
            # the runtime image's sanity gate hides HOST_CPUS itself (scripts/install_wheels.sh): a mount
            *(["--cap-add", "CAP_SYS_ADMIN"] if req.emulated else []),
            *req.args(),
            "--pull=true" if req.pull else "--pull=never",
            "--",
            str(req.context),
        ]

    def run_request(self, req: RunRequest) -> runner.Completed:
        if req.qemu_cpu:  # as root, to mount over HOST_CPUS; then the user the run is for
            user = req.user if req.user is not None else self.image_user(req.image)
            env = {**(req.env or {}), "QEMU_CPU": req.qemu_cpu}
            req = replace(req, command=_without_host_cpus(req.command, user), user="0:0", env=env)
        created = runner.run(self.command("from", "--pull=false", "--", req.image))
        if not created.ok:
            raise TorchkilnError(f"buildah from {req.image} failed: {created.first_error() or 'no output'}")
        container = created.stdout.strip().splitlines()[-1]
        try:
            # chroot isolation names the container after its id but puts no such line in /etc/hosts; torchrun
            # (the verify suite's DDP checks) resolves its own hostname, so use one that resolves.
            argv = self.command("run", "--isolation", self.isolation, "--hostname", "localhost")
            argv += ["--cap-add", "CAP_SYS_ADMIN"] if req.qemu_cpu else []
            argv += [*req.options(), container, "--", *req.command]
            return runner.run(argv, capture=req.capture, timeout=req.timeout)
        finally:
            runner.run(self.command("rm", "--", container))

    def image_config(self, image: str) -> ImageConfig:
        config = (
            self._inspect("inspect", "--type", "image", "--", image).get("Docker", {}).get("config") or {}
        )
        return ImageConfig(config.get("User") or "", dict(config.get("Labels") or {}))

    def image_size(self, image: str) -> int | None:
        done = runner.run(self.command("images", "--json", "--", image))
        if not done.ok:
            return None
        entries = json.loads(done.stdout or "[]")
        return parse_size(str(entries[0].get("size", ""))) if entries else None

    def image_exists(self, image: str) -> bool:
        return runner.run(self.command("inspect", "--type", "image", "--", image)).ok

    def remove_image(self, image: str) -> None:
        runner.run(self.command("rmi", "--force", "--", image))


# --------------------------------------------------------------------------------------------------
# Choosing one.
# --------------------------------------------------------------------------------------------------

ENGINES: dict[str, type[Engine]] = {"docker": Docker, "podman": Podman, "buildah": Buildah}
# ``--engine auto``: docker when its daemon answers, else the daemonless engines, buildah first (what CI
# installs; podman's `run` needs an OCI runtime that works on the host, buildah's chroot does not).
AUTO_ORDER = ("docker", "buildah", "podman")


def select_engine(choice: str = "auto", *, storage: Storage | None = None, for_print: bool = False) -> Engine:
    """The engine to use: ``choice``, or with ``auto`` the first of :data:`AUTO_ORDER` that can build here
    (docker is skipped when a private storage is asked for: only the daemonless engines have one).

    With ``for_print`` nothing needs to run, so an absent engine is not an error: the chosen one (or docker,
    the one users' CI most often has) is returned for showing its command.
    """
    storage = storage or Storage()
    if choice not in ("auto", *ENGINES):
        raise UsageError(f"--engine {choice!r} is not an engine (valid: auto, {', '.join(ENGINES)})")
    if choice != "auto":
        cls = ENGINES[choice]
        found = shutil.which(choice)
        if found is None and not for_print:
            raise TorchkilnError(f"--engine {choice}: no `{choice}` on PATH ({cls.install_hint})")
        return cls.create(found or choice, storage)
    for name in AUTO_ORDER:
        cls = ENGINES[name]
        if storage.chosen and not cls.private_storage:
            continue
        found = shutil.which(name)
        if found is not None and cls.usable(found):
            return cls.create(found, storage)
    if for_print:
        fallback = next(ENGINES[n] for n in AUTO_ORDER if ENGINES[n].private_storage or not storage.chosen)
        return fallback.create(fallback.name, storage)
    raise TorchkilnError(
        "no container engine: neither a Docker engine with buildx, nor buildah, nor podman is usable here "
        "(install one; CI: apt-get install buildah)"
    )
