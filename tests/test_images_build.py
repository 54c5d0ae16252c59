"""Real image builds with buildah (root, ``--isolation chroot --storage-driver vfs``), on a Debian bookworm
base made here with debootstrap (no registry is reachable):

* the devel image of the CPU recipe (real apt and pip steps: compilers, cmake, MKL, torchkiln);
* the runtime image from a dist/ holding the torch 2.13.0 CPU wheel; the verification suite runs inside
  it and passes, as the non-root user, with no compiler or nvcc in the image;
* a build given a dummy cache password as a secret: the password is nowhere in the layers, the config or
  the history, while the step that used it saw it.

One private storage root per session (removed at the end), one debootstrap per session. Image sizes go
to the terminal and to .torchkiln/images-report.json.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchkiln import cli
from torchkiln.container import Buildah, BuildRequest, Storage, run_in_image
from torchkiln.images import image_tag, wheel_commit
from torchkiln.recipe import load_recipe

pytestmark = [pytest.mark.buildah, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
CPU_RECIPE = ROOT / "recipes" / "torch-2.13-cpu-py311.toml"
BASE = "localhost/torchkiln-test-base:bookworm"
REPORT = ROOT / ".torchkiln" / "images-report.json"
WHEEL_DIRS = (Path("/opt/wheels"), ROOT / "dist")


def _require(condition: bool, reason: str) -> None:
    if condition:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(reason)


def _report(key: str, value: object) -> None:
    data = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    data[key] = value
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    tmp = REPORT.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, REPORT)


def _say(capsys: pytest.CaptureFixture[str], text: str) -> None:
    with capsys.disabled():
        print(f"\n[images] {text}")


@pytest.fixture(scope="session")
def storage_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    _require(os.geteuid() == 0, "image builds need root")
    for tool in ("buildah", "debootstrap"):
        _require(
            shutil.which(tool) is not None, f"{tool} is not installed (apt-get install buildah debootstrap)"
        )
    root = tmp_path_factory.mktemp("buildah")
    yield root
    engine = Buildah("buildah", Storage(root / "storage", root / "run", "vfs"))
    subprocess.run(engine.storage_argv("rm", "--all"), capture_output=True, check=False)
    subprocess.run(engine.storage_argv("rmi", "--all", "--force"), capture_output=True, check=False)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def engine(storage_root: Path) -> Buildah:
    return Buildah("buildah", Storage(storage_root / "storage", storage_root / "run", "vfs"))


@pytest.fixture(scope="session")
def base_image(engine: Buildah, storage_root: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Debian bookworm (minbase) imported as an image. The host's CA bundle goes in as a local CA, so
    TLS through this machine's egress proxy works in RUN steps (as a corporate CA would)."""
    work = tmp_path_factory.mktemp("base")
    rootfs = work / "rootfs"
    start = time.monotonic()
    done = subprocess.run(
        ["debootstrap", "--variant=minbase", "bookworm", str(rootfs), "http://deb.debian.org/debian"],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    host_ca = Path("/etc/ssl/certs/ca-certificates.crt")
    if host_ca.is_file():
        local = rootfs / "usr/local/share/ca-certificates"
        local.mkdir(parents=True, exist_ok=True)
        shutil.copy(host_ca, local / "host-ca.crt")
    context = work / "context"
    context.mkdir()
    with tarfile.open(context / "rootfs.tar", "w") as tar:
        tar.add(rootfs, arcname=".")
    shutil.rmtree(rootfs)
    (context / "Containerfile").write_text('FROM scratch\nADD rootfs.tar /\nCMD ["/bin/bash"]\n')
    done = subprocess.run(
        engine.storage_argv("bud", "--isolation", "chroot", "--tag", BASE, str(context)),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    shutil.rmtree(context)
    _report("base_seconds", round(time.monotonic() - start, 1))
    return BASE


def _size(engine: Buildah, image: str) -> int:
    from torchkiln.commands.images import image_size

    size = image_size(engine, image)
    assert size, image
    return size


def _torch_wheel() -> Path:
    for directory in WHEEL_DIRS:
        found = sorted(directory.glob("torch-2.13.0*-cp311-*.whl")) if directory.is_dir() else []
        if found:
            return found[0]
    _require(False, "no torch 2.13.0 cp311 wheel in /opt/wheels or dist/")
    raise AssertionError  # unreachable: _require skipped or failed


def _cli_build(storage_root: Path, *args: str) -> int:
    return cli.main(
        [
            "images",
            "--recipe",
            str(CPU_RECIPE),
            "--engine",
            "buildah",
            "--base-image",
            BASE,
            "--no-pull",
            "--storage-root",
            str(storage_root),
            "--storage-driver",
            "vfs",
            *args,
        ]
    )


def test_devel_image_for_the_cpu_recipe(
    engine: Buildah, storage_root: Path, base_image: str, capsys: pytest.CaptureFixture[str]
) -> None:
    start = time.monotonic()
    assert _cli_build(storage_root, "--target", "devel") == 0
    seconds = time.monotonic() - start
    image = image_tag(load_recipe(CPU_RECIPE), "devel")
    probe = run_in_image(
        engine,
        image,
        [
            "bash",
            "-c",
            "gcc -dumpversion; python --version; cmake --version | head -1; "
            "ls /opt/intel/lib/libmkl_core.a; torchkiln --version",
        ],
        capture=True,
    )
    assert probe.returncode == 0, probe.stderr
    lines = probe.stdout.splitlines()
    assert (
        lines[0] == "12" and lines[1].startswith("Python 3.11.") and lines[2].startswith("cmake version 3.25")
    )
    assert lines[3] == "/opt/intel/lib/libmkl_core.a" and lines[4].startswith("torchkiln ")
    size, base = _size(engine, image), _size(engine, base_image)
    _report("devel", {"seconds": round(seconds, 1), "bytes": size, "base_bytes": base})
    _say(
        capsys,
        f"devel image {image}: {size / 1e6:.0f} MB (base {base / 1e6:.0f} MB), built in {seconds:.0f} s",
    )


def test_runtime_image_passes_the_verify_suite_as_a_non_root_user(
    engine: Buildah, storage_root: Path, base_image: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheel = _torch_wheel()
    dist = tmp_path / "dist"
    dist.mkdir()
    try:
        os.link(wheel, dist / wheel.name)
    except OSError:
        shutil.copy(wheel, dist / wheel.name)
    # A torchvision wheel the build pipeline left in dist/ goes in too (the sanity gate then checks its ops).
    for vision in sorted((ROOT / "dist").glob("torchvision-0.28.0*-cp311-*.whl")):
        shutil.copy(vision, dist / vision.name)
    start = time.monotonic()
    assert _cli_build(storage_root, "--target", "runtime", "--dist", str(dist), "--verify") == 0
    seconds = time.monotonic() - start
    image = image_tag(load_recipe(CPU_RECIPE), "runtime")

    probe = run_in_image(
        engine,
        image,
        [
            "sh",
            "-c",
            "id -un; id -u; for t in gcc g++ cc c++ nvcc; do "
            "command -v $t || echo no-$t; done; du -sb /opt/venv | cut -f1; "
            "sha256sum /opt/torchkiln/recipe.toml | cut -d' ' -f1",
        ],
        capture=True,
    )
    assert probe.returncode == 0, probe.stderr
    lines = probe.stdout.split()
    assert lines[:2] == ["kiln", "10001"]
    assert lines[2:7] == ["no-gcc", "no-g++", "no-cc", "no-c++", "no-nvcc"]
    venv_bytes = int(lines[7])
    assert lines[8] == load_recipe(CPU_RECIPE).sha256  # the image carries its recipe

    inspect = subprocess.run(
        engine.storage_argv("inspect", "--type", "image", image), capture_output=True, text=True, check=True
    )
    config = json.loads(inspect.stdout)["Docker"]["config"]
    labels = config["Labels"]
    assert config["User"] == "10001:10001"
    assert labels["io.torchkiln.recipe"] == "torch-2.13-cpu-py311"
    assert labels["io.torchkiln.recipe-sha256"] == load_recipe(CPU_RECIPE).sha256
    assert labels["io.torchkiln.torch-commit"] == wheel_commit(wheel, "torch") != ""
    assert labels["io.torchkiln.torch-version"] == "2.13.0+cpu"
    assert labels["org.opencontainers.image.version"] == "2.13.0+cpu"  # the wheel's, not the recipe's

    size, base = _size(engine, image), _size(engine, base_image)
    # Close to base + installed packages: Python and its venv from apt are the only other thing in it.
    assert size <= base + venv_bytes + 150e6, (size, base, venv_bytes)
    _report(
        "runtime",
        {
            "seconds_with_verify": round(seconds, 1),
            "bytes": size,
            "base_bytes": base,
            "venv_bytes": venv_bytes,
        },
    )
    _say(
        capsys,
        f"runtime image {image}: {size / 1e6:.0f} MB = base {base / 1e6:.0f} MB + venv "
        f"{venv_bytes / 1e6:.0f} MB + {(size - base - venv_bytes) / 1e6:.0f} MB; build + verify {seconds:.0f} s",
    )


def _blobs(directory: Path) -> Iterator[bytes]:
    for blob in sorted((directory / "blobs").rglob("*")):
        if blob.is_file():
            data = blob.read_bytes()
            yield gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def test_cache_secret_reaches_the_step_but_not_the_image(
    engine: Buildah, base_image: str, tmp_path: Path
) -> None:
    password = "kiln-dummy-cache-password-5f0c2a"
    secret = tmp_path / "pw"
    secret.write_text(password)
    req = BuildRequest(
        dockerfile=ROOT / "tests" / "data" / "images" / "Dockerfile.secret",
        context=ROOT,
        target="",
        tags=("localhost/torchkiln-secret-test:latest",),
        build_args={"BASE_IMAGE": base_image},
        secrets={"cache_password": secret},
        pull=False,
    )
    argv = engine.build_argv(req)
    argv[argv.index("--target") : argv.index("--target") + 2] = []  # single stage: no target
    assert password not in " ".join(argv)
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert password not in done.stdout + done.stderr
    image = req.tags[0]

    # The step saw the secret under the recipe's variable name ...
    seen = run_in_image(engine, image, ["cat", "/secret-sha256"], capture=True)
    assert seen.stdout.split()[0] == hashlib.sha256(password.encode()).hexdigest()

    # ... and it is in no layer, nor the config or history.
    layout = tmp_path / "oci"
    pushed = subprocess.run(
        engine.storage_argv("push", "--disable-compression", image, f"oci:{layout}"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert pushed.returncode == 0, pushed.stderr
    blobs = list(_blobs(layout))
    assert any(b"kiln-layer-canary-7c1e" in blob for blob in blobs), "the scan does not see layer contents"
    assert not [i for i, blob in enumerate(blobs) if password.encode() in blob]
    inspect = subprocess.run(
        engine.storage_argv("inspect", "--type", "image", image), capture_output=True, text=True, check=True
    )
    assert "CCACHE_REMOTE_PASSWORD" in inspect.stdout  # the history is there: the RUN line names the variable
    assert password not in inspect.stdout
