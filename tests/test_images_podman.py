"""podman as the third engine, for real (torchkiln.images.engines.Podman): a small multi-stage image built by podman
on a private vfs storage root with chroot isolation, from a root file system made here of the host's own shell
and a few tools (no registry, no debootstrap: seconds). It uses every option torchkiln's builds use (build args,
labels, a named context, a secret, --no-pull, a target stage, a local export) and reads the result back through
the engine's class: existence, user, labels, size, removal, and a run with env, a read-only mount and a user.

Skipped where podman is not installed (CI installs it: there the skip is a failure); the `run` part needs an OCI
runtime that can start containers on this host, and is skipped with the runtime's own error where none can.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import resource
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit import ROOT
from kit.imagekit import require

from torchkiln.images.engines import BuildRequest, Podman, Storage
from torchkiln.process import runner

pytestmark = [pytest.mark.integration]

TOOLS = ("/bin/dash", "/bin/cat", "/usr/bin/id", "/usr/bin/cut", "/usr/bin/sha256sum")
IMAGE = "localhost/torchkiln-podman-test:1"
BASE = "localhost/torchkiln-podman-base:1"
SECRET = "kiln-dummy-podman-secret-4e1d"

CONTAINERFILE = """\
ARG BASE_IMAGE
FROM ${BASE_IMAGE} AS runtime
ARG KILN_GREETING=unset
RUN --mount=type=bind,from=recipe,target=/mnt/recipe \\
    --mount=type=secret,id=cache_password \\
    sh -c 'cat /mnt/recipe/recipe.toml > /recipe.toml && echo "$KILN_GREETING" > /greeting \\
           && sha256sum /run/secrets/cache_password | cut -c1-64 > /secret-sha256 \\
           && echo kiln-layer-canary-9b2f > /canary'
LABEL io.torchkiln.test="podman"
USER 10001:10001

FROM runtime AS build
RUN sh -c 'echo wheel-bytes > /tmp/kiln_test-1.0-py3-none-any.whl'

FROM scratch AS wheels
COPY --from=build /tmp/kiln_test-1.0-py3-none-any.whl /
"""


def _rootfs_tar(path: Path) -> None:
    """A root file system of the host's own tools and the libraries they load (ldd), as a tar file."""
    root = path.parent / "rootfs"
    for tool in TOOLS:
        require(
            Path(tool).exists(),
            f"{tool} is not on this host (the test's tiny root file system is made of the host's tools)",
        )
        files = [Path(tool)]
        done = runner.run(["ldd", tool], check=True)
        files += [Path(word) for word in done.stdout.split() if word.startswith("/")]
        for file in files:
            target = root / file.relative_to("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file.resolve(), target)
    (root / "bin" / "sh").symlink_to("dash")
    for directory in ("tmp", "etc", "run"):
        (root / directory).mkdir(exist_ok=True)
    (root / "tmp").chmod(0o1777)
    (root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\nkiln:x:10001:10001::/tmp:/bin/sh\n")
    with tarfile.open(path, "w") as tar:
        tar.add(root, arcname=".")
    shutil.rmtree(root)


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    require(shutil.which("podman") is not None, "podman is not installed (apt-get install podman)")
    require(os.geteuid() == 0, "the podman test runs podman as root (a private vfs storage root)")
    root = tmp_path_factory.mktemp("podman")
    engine = Podman(shutil.which("podman") or "podman", Storage(root / "storage", root / "run", "vfs"))
    yield engine
    runner.run(engine.command("rmi", "--all", "--force"))
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def built(podman: Podman, tmp_path_factory: pytest.TempPathFactory) -> tuple[BuildRequest, Path]:
    work = tmp_path_factory.mktemp("podman-context")
    context = work / "context"
    context.mkdir()
    _rootfs_tar(context / "rootfs.tar")
    (context / "Containerfile.base").write_text("FROM scratch\nADD rootfs.tar /\n")
    podman.build(BuildRequest(context / "Containerfile.base", context, "", (BASE,), {}, pull=False))
    (context / "Containerfile").write_text(CONTAINERFILE)
    recipes = work / "recipes"
    recipes.mkdir()
    (recipes / "recipe.toml").write_text('[recipe]\nname = "podman-test"\n')
    secret = work / "pw"
    secret.write_text(SECRET)
    req = BuildRequest(
        dockerfile=context / "Containerfile",
        context=context,
        target="runtime",
        tags=(IMAGE,),
        build_args={"BASE_IMAGE": BASE, "KILN_GREETING": "hello from podman"},
        named_contexts={"recipe": recipes},
        secrets={"cache_password": secret},
        labels={"io.torchkiln.recipe": "podman-test"},
        pull=False,
    )
    argv = podman.build_argv(req)
    assert SECRET not in " ".join(argv)
    done = runner.run(argv)
    assert done.ok, done.describe()
    assert SECRET not in done.output
    return req, secret


def test_podman_builds_an_image_that_its_class_reads_back(
    podman: Podman, built: tuple[BuildRequest, Path]
) -> None:
    assert podman.image_exists(IMAGE) and not podman.image_exists("localhost/torchkiln-podman-nothing:1")
    config = podman.image_config(IMAGE)
    assert config.user == "10001:10001"
    assert config.labels["io.torchkiln.recipe"] == "podman-test"  # --label
    assert config.labels["io.torchkiln.test"] == "podman"  # the Containerfile's LABEL
    size = podman.image_size(IMAGE)
    base = podman.image_size(BASE)
    assert size is not None and base is not None and base < size < base + 1_000_000


def _blobs(directory: Path) -> Iterator[bytes]:
    for blob in sorted((directory / "blobs").rglob("*")):
        if blob.is_file():
            data = blob.read_bytes()
            yield gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def test_the_secret_reached_the_step_but_no_layer(
    podman: Podman, built: tuple[BuildRequest, Path], tmp_path: Path
) -> None:
    layout = tmp_path / "oci"
    saved = runner.run(podman.command("save", "--format", "oci-dir", "--output", str(layout), IMAGE))
    assert saved.ok, saved.describe()
    blobs = list(_blobs(layout))
    assert any(b"kiln-layer-canary-9b2f" in blob for blob in blobs), "the scan does not see layer contents"
    assert not [i for i, blob in enumerate(blobs) if SECRET.encode() in blob]
    # ... while the step that mounted it saw it (it wrote the secret's sha256 into the layer)
    assert any(hashlib.sha256(SECRET.encode()).hexdigest().encode() in blob for blob in blobs)


def test_podman_exports_a_stage_instead_of_storing_an_image(
    podman: Podman, built: tuple[BuildRequest, Path], tmp_path: Path
) -> None:
    """The wheels target's way: --output type=local, files into a directory, no image."""
    req, _ = built
    export = BuildRequest(
        req.dockerfile, req.context, "wheels", ("localhost/torchkiln-podman-wheels:1",), req.build_args,
        req.named_contexts, req.secrets, pull=False, output=tmp_path / "dist",
    )  # fmt: skip
    podman.build(export)
    assert [p.name for p in (tmp_path / "dist").iterdir()] == ["kiln_test-1.0-py3-none-any.whl"]
    assert (tmp_path / "dist" / "kiln_test-1.0-py3-none-any.whl").read_text() == "wheel-bytes\n"


def test_no_pull_with_a_base_image_podman_does_not_have_fails(
    podman: Podman, built: tuple[BuildRequest, Path]
) -> None:
    req, _ = built
    missing = BuildRequest(
        req.dockerfile, req.context, "runtime", ("localhost/torchkiln-podman-never:1",),
        {**req.build_args, "BASE_IMAGE": "localhost/torchkiln-podman-absent:1"}, req.named_contexts,
        req.secrets, pull=False,
    )  # fmt: skip
    done = runner.run(podman.build_argv(missing))
    assert not done.ok and not podman.image_exists("localhost/torchkiln-podman-never:1")


def _runtime_conf(tmp_path: Path) -> Path:
    """A containers.conf for hosts whose sandbox refuses the rlimits podman sets by default (a container
    inside a container): runc, and open-files / processes limits no higher than this process's own."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 4096)
    conf = tmp_path / "containers.conf"
    conf.write_text(
        f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        '[engine]\nruntime = "runc"\n'
    )
    return conf


def test_podman_runs_the_image_with_env_mounts_and_user(
    podman: Podman, built: tuple[BuildRequest, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "note").write_text("mounted\n")
    command = ["sh", "-c", 'id -u; cat /greeting; echo "$KILN_X"; cat /mnt/data/note; cat /recipe.toml']

    def run() -> runner.Completed:
        return podman.run(IMAGE, command, env={"KILN_X": "x y"}, mounts={data: "/mnt/data"}, capture=True)

    done = run()
    if not done.ok and shutil.which("runc"):
        monkeypatch.setenv("CONTAINERS_CONF", str(_runtime_conf(tmp_path)))
        done = run()
    require(done.ok, f"podman cannot start a container on this host: {done.first_error()}")
    assert done.stdout.splitlines() == [
        "10001",
        "hello from podman",
        "x y",
        "mounted",
        "[recipe]",
        'name = "podman-test"',
    ]
    as_root = podman.run(IMAGE, ["id", "-u"], user="0", capture=True)
    assert as_root.ok and as_root.stdout.strip() == "0"
    podman.remove_image(IMAGE)
    assert not podman.image_exists(IMAGE)


def test_images_cli_prints_the_podman_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`torchkiln images --engine podman --print`: podman's own spelling of the same request, with the
    private storage options before the subcommand."""
    from torchkiln import cli

    recipe = ROOT / "recipes" / "torch-2.13-cpu-py311.toml"
    rc = cli.main(
        ["images", "--recipe", str(recipe), "--engine", "podman", "--print", "--storage-root", str(tmp_path),
         "--storage-driver", "vfs", "--no-pull"]
    )  # fmt: skip
    out = capsys.readouterr().out.split()
    assert rc == 0 and Path(out[0]).name == "podman"
    assert out[1:8] == [
        "--root",
        str(tmp_path / "storage"),
        "--runroot",
        str(tmp_path / "run"),
        "--storage-driver",
        "vfs",
        "build",
    ]
    assert "--pull=never" in out and "--load" not in out
