"""Real image builds with buildah (root, ``--isolation chroot``, overlay storage where the kernel mounts one, else
vfs: imagekit.storage_driver), on a Debian bookworm
base made here with debootstrap (no registry is reachable):

* the devel image of the CPU recipe (real apt and pip steps: compilers, cmake, MKL, torchkiln);
* the runtime image from a dist/ holding the torch 2.13.0 CPU wheel (upstream's: its manifest is written by
  tests/kit/dists.manifest_for_upstream, which says so, with the wheel's SBOM and a provenance statement signed
  here with an ECDSA P-256 key); the verification suite runs inside it against that manifest and that
  statement and passes, as the non-root user, with no compiler or nvcc in the image; the image carries its
  own SBOM (valid CycloneDX: its Debian and Python packages), the statement and its key (labelled with the
  statement's digest), and the private key is in none of its layers, its config or its history;
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
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from kit import ROOT
from kit.dists import manifest_for_upstream, wheel_commit
from kit.imagekit import cli_build, report, require, say, stored_size

from torchkiln.artifacts import provenance, sbom
from torchkiln.artifacts.manifest import load_manifest
from torchkiln.artifacts.signing import public_pem
from torchkiln.images import rootfs
from torchkiln.images.engines import Buildah, BuildRequest
from torchkiln.images.platforms import platform_named
from torchkiln.images.spec import image_tag
from torchkiln.process import runner
from torchkiln.recipe.loader import load_recipe

pytestmark = [pytest.mark.buildah, pytest.mark.slow, pytest.mark.usefixtures("own_images")]

CPU_RECIPE = ROOT / "recipes" / "torch-2.13-cpu-py311.toml"
WHEEL_DIRS = (Path("/opt/wheels"), ROOT / "dist")


def _torch_wheel() -> Path:
    for directory in WHEEL_DIRS:
        found = sorted(directory.glob("torch-2.13.0*-cp311-*.whl")) if directory.is_dir() else []
        if found:
            return found[0]
    require(False, "no torch 2.13.0 cp311 wheel in /opt/wheels or dist/")
    raise AssertionError  # unreachable: require skipped or failed


def _cli_build(engine: Buildah, *args: str) -> int:
    return cli_build(engine, CPU_RECIPE, *args)


def test_devel_image_for_the_cpu_recipe(
    engine: Buildah, base_image: str, capsys: pytest.CaptureFixture[str]
) -> None:
    start = time.monotonic()
    assert _cli_build(engine, "--target", "devel") == 0
    seconds = time.monotonic() - start
    image = image_tag(load_recipe(CPU_RECIPE), "devel")
    probe = engine.run(
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
    size, base = stored_size(engine, image), stored_size(engine, base_image)
    report("devel", {"seconds": round(seconds, 1), "bytes": size, "base_bytes": base})
    say(
        capsys,
        f"devel image {image}: {size / 1e6:.0f} MB (base {base / 1e6:.0f} MB), built in {seconds:.0f} s",
    )


@pytest.mark.timeout(1500)  # a loaded 2-core machine: the build, the suite inside, a 1.2 GB push and scan
def test_runtime_image_passes_the_verify_suite_as_a_non_root_user(
    engine: Buildah, base_image: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
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
    manifest = manifest_for_upstream(load_recipe(CPU_RECIPE), dist, f"{wheel.parent} (upstream's CPU wheel)")
    key, pub = _sign(dist, manifest, tmp_path)
    start = time.monotonic()
    assert (
        _cli_build(
            engine, "--target", "runtime", "--dist", str(dist), "--provenance-key", str(pub), "--verify"
        )
        == 0
    )
    seconds = time.monotonic() - start
    image = image_tag(load_recipe(CPU_RECIPE), "runtime")

    probe = engine.run(
        image,
        [
            "sh",
            "-c",
            "id -un; id -u; for t in gcc g++ cc c++ nvcc; do "
            "command -v $t || echo no-$t; done; du -sb /opt/venv | cut -f1; "
            "sha256sum /opt/torchkiln/recipe.toml /opt/torchkiln/manifest.json | cut -d' ' -f1",
        ],
        capture=True,
    )
    assert probe.returncode == 0, probe.stderr
    lines = probe.stdout.split()
    assert lines[:2] == ["kiln", "10001"]
    assert lines[2:7] == ["no-gcc", "no-g++", "no-cc", "no-c++", "no-nvcc"]
    venv_bytes = int(lines[7])
    assert lines[8] == load_recipe(CPU_RECIPE).sha256  # the image carries its recipe
    assert lines[9] == hashlib.sha256(manifest.read_bytes()).hexdigest()  # and the manifest of its wheels

    config = engine.image_config(image)
    labels = config.labels
    assert config.user == "10001:10001"
    assert labels["io.torchkiln.recipe"] == "torch-2.13-cpu-py311"
    assert labels["io.torchkiln.recipe-sha256"] == load_recipe(CPU_RECIPE).sha256
    # from the manifest: the version it lists, the commit its source records
    assert labels["io.torchkiln.torch-commit"] == wheel_commit(wheel, "torch") != ""
    assert labels["io.torchkiln.torch-version"] == "2.13.0+cpu"
    assert labels["org.opencontainers.image.version"] == "2.13.0+cpu"  # the wheel's, not the recipe's

    supply_start = time.monotonic()
    _check_supply_chain(engine, image, dist, key, tmp_path)
    supply_seconds = time.monotonic() - supply_start

    size, base = stored_size(engine, image), stored_size(engine, base_image)
    # Close to base + installed packages: Python and its venv from apt are the only other thing in it.
    assert size <= base + venv_bytes + 150e6, (size, base, venv_bytes)
    report(
        "runtime",
        {
            "seconds_with_verify": round(seconds, 1),
            "bytes": size,
            "base_bytes": base,
            "venv_bytes": venv_bytes,
            "supply_chain_check_seconds": round(supply_seconds, 1),
        },
    )
    say(
        capsys,
        f"runtime image {image}: {size / 1e6:.0f} MB = base {base / 1e6:.0f} MB + venv "
        f"{venv_bytes / 1e6:.0f} MB + {(size - base - venv_bytes) / 1e6:.0f} MB; build + verify {seconds:.0f} s",
    )


def _sign(dist: Path, manifest: Path, tmp_path: Path) -> tuple[ec.EllipticCurvePrivateKey, Path]:
    """The wheel's SBOM and a statement signed with a fresh ECDSA P-256 key into ``dist`` (as
    ``torchkiln build --sign-key-file`` leaves them); the key stays outside the build context."""
    recipe = load_recipe(CPU_RECIPE)
    loaded = load_manifest(manifest)
    sboms = sbom.write_wheel_sboms(dist, loaded, recipe)
    key = ec.generate_private_key(ec.SECP256R1())
    data = provenance.statement(
        loaded, parameters={"note": "upstream's wheel"}, byproducts=[manifest, *sboms]
    )
    provenance.write_signed(dist / provenance.statement_name(recipe.name), data, key)
    pub = tmp_path / "provenance.pub"
    pub.write_bytes(public_pem(key))
    return key, pub


def _check_supply_chain(
    engine: Buildah, image: str, dist: Path, key: ec.EllipticCurvePrivateKey, tmp_path: Path
) -> None:
    """The image keeps the statement (labelled with its digest), the key, the wheels' SBOMs and its own
    (valid CycloneDX listing its Debian and Python packages); the private key is in no layer, nor the config
    or history. One push to an OCI layout serves both: its layers are read for the files and scanned for
    the key (no container is started: on vfs each one is a full copy of the root file system)."""
    statement = dist / provenance.statement_name(load_recipe(CPU_RECIPE).name)
    labels = engine.image_config(image).labels
    assert labels["io.torchkiln.provenance"] == statement.name
    assert labels["io.torchkiln.provenance-sha256"] == hashlib.sha256(statement.read_bytes()).hexdigest()
    layout = tmp_path / "runtime-oci"
    pushed = runner.run(engine.command("push", "--disable-compression", image, f"oci:{layout}"))
    assert pushed.ok, pushed.describe()
    sboms = [p.name for p in dist.glob("*.cdx.json")]
    wanted = {f"opt/torchkiln/{n}" for n in [statement.name, "provenance-key.pub", "image.cdx.json", *sboms]}
    files = _layer_files(layout, wanted)
    assert set(files) == wanted
    assert files[f"opt/torchkiln/{statement.name}"] == statement.read_bytes()
    assert files["opt/torchkiln/provenance-key.pub"] == public_pem(key)
    image_sbom = files["opt/torchkiln/image.cdx.json"].decode()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(image_sbom) is None
    components = json.loads(image_sbom)["components"]
    debs = {c["name"] for c in components if c["purl"].startswith("pkg:deb/")}
    pythons = {c["name"]: c["version"] for c in components if c["purl"].startswith("pkg:pypi/")}
    assert {"python3.11", "libc6", "ca-certificates"} <= debs
    assert pythons["torch"] == "2.13.0+cpu" and "torchkiln" in pythons and "pytest" in pythons

    plain = serialization.NoEncryption()
    der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, plain)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, plain)
    scalar = key.private_numbers().private_value.to_bytes(32, "big")
    needles = [der, pem.splitlines()[1], scalar, public_pem(key).splitlines()[1]]
    seen = _scan(layout, needles)
    assert seen[-1], "the scan does not see the public key the image keeps"
    assert not any(seen[:-1]), "the private key is in a layer or the config"
    inspect = runner.run(engine.command("inspect", "--type", "image", image))
    assert inspect.ok and pem.splitlines()[1].decode() not in inspect.stdout
    shutil.rmtree(layout)


def _layer_files(layout: Path, names: set[str]) -> dict[str, bytes]:
    """The regular files ``names`` (paths without a leading /) found in the layers of an OCI layout."""
    found: dict[str, bytes] = {}
    for blob in sorted((layout / "blobs").rglob("*")):
        if not blob.is_file() or not tarfile.is_tarfile(blob):
            continue
        with tarfile.open(blob) as tar:
            for member in tar:
                name = member.name.removeprefix("./")
                handle = tar.extractfile(member) if name in names and member.isfile() else None
                if handle is not None:
                    found[name] = handle.read()
    return found


def _scan(layout: Path, needles: list[bytes], block: int = 64 << 20) -> list[bool]:
    """Whether each needle occurs in any blob of the layout (uncompressed layers, config, manifest), read
    in blocks that overlap by the longest needle."""
    seen = [False] * len(needles)
    overlap = max(len(n) for n in needles)
    for blob in sorted((layout / "blobs").rglob("*")):
        if not blob.is_file():
            continue
        with blob.open("rb") as handle:
            tail = b""
            while chunk := handle.read(block):
                window = tail + chunk
                seen = [s or n in window for s, n in zip(seen, needles, strict=True)]
                tail = window[-overlap:]
    return seen


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
        target="",  # single stage
        tags=("localhost/torchkiln-secret-test:latest",),
        build_args={"BASE_IMAGE": base_image},
        secrets={"cache_password": secret},
        pull=False,
    )
    argv = engine.build_argv(req)
    assert password not in " ".join(argv)
    done = runner.run(argv)
    assert done.ok, done.describe()
    assert password not in done.output
    image = req.tags[0]

    # The step saw the secret under the recipe's variable name ...
    seen = engine.run(image, ["cat", "/secret-sha256"], capture=True)
    assert seen.stdout.split()[0] == hashlib.sha256(password.encode()).hexdigest()

    # ... and it is in no layer, nor the config or history.
    layout = tmp_path / "oci"
    pushed = runner.run(engine.command("push", "--disable-compression", image, f"oci:{layout}"))
    assert pushed.ok, pushed.describe()
    blobs = list(_blobs(layout))
    assert any(b"kiln-layer-canary-7c1e" in blob for blob in blobs), "the scan does not see layer contents"
    assert not [i for i, blob in enumerate(blobs) if password.encode() in blob]
    inspect = runner.run(engine.command("inspect", "--type", "image", image))
    assert inspect.ok, inspect.describe()
    assert "CCACHE_REMOTE_PASSWORD" in inspect.stdout  # the history is there: the RUN line names the variable
    assert password not in inspect.stdout


def test_pip_config_reaches_the_pip_steps_but_not_the_image(
    engine: Buildah, base_image: str, tmp_path: Path
) -> None:
    """--pip-config FILE: a mirror's index URL with credentials, mounted at /etc/pip.conf for the step only."""
    password = "kiln-dummy-index-password-91ab"
    config = tmp_path / "pip.conf"
    config.write_text(f"[global]\nindex-url = https://kiln:{password}@mirror.invalid/simple\n")
    req = BuildRequest(
        dockerfile=ROOT / "tests" / "data" / "images" / "Dockerfile.pipconf",
        context=ROOT,
        target="",  # single stage
        tags=("localhost/torchkiln-pipconf-test:latest",),
        build_args={"BASE_IMAGE": base_image},
        secrets={"pip_config": config},
        pull=False,
    )
    done = runner.run(engine.build_argv(req))
    assert done.ok, done.describe()
    assert password not in done.output
    image = req.tags[0]
    seen = engine.run(
        image, ["sh", "-c", "cat /pip-conf-sha256; test -e /etc/pip.conf || echo gone"], capture=True
    )
    assert seen.stdout.split() == [hashlib.sha256(config.read_bytes()).hexdigest(), "gone"]
    layout = tmp_path / "oci"
    pushed = runner.run(engine.command("push", "--disable-compression", image, f"oci:{layout}"))
    assert pushed.ok, pushed.describe()
    blobs = list(_blobs(layout))
    assert any(b"kiln-layer-canary-3d9a" in blob for blob in blobs), "the scan does not see layer contents"
    assert not [i for i, blob in enumerate(blobs) if password.encode() in blob]


def test_a_root_given_as_a_tar_is_imported_as_the_base_with_its_ca(
    engine: Buildah, storage_root: Path, tmp_path: Path
) -> None:
    """--base-rootfs TAR (compressed, as ADD unpacks it): the tar's files are the image's, and each --base-ca
    certificate lands where ca-certificates reads local CAs. A tiny root: the import is what is tested (the
    whole debootstrapped root goes the same way in the base_image fixture)."""
    tree = tmp_path / "root"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "os-release").write_text("ID=kilntest\n")
    tar = tmp_path / "root.tar.gz"
    with tarfile.open(tar, "w:gz") as archive:
        archive.add(tree, arcname=".")
    ca = tmp_path / "proxy.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIBkilntest\n-----END CERTIFICATE-----\n")
    base = rootfs.plan_rootfs(str(tar), cas=[str(ca)], target=platform_named("x86_64"))
    assert rootfs.ensure(engine, base) == base.tag and engine.image_exists(base.tag)
    created = runner.run(engine.command("from", "--pull=false", base.tag), check=True)
    container = created.stdout.strip().splitlines()[-1]
    try:
        mounted = Path(runner.run(engine.command("mount", container), check=True).stdout.strip())
        assert (mounted / "etc" / "os-release").read_text() == "ID=kilntest\n"
        assert (
            mounted / "usr/local/share/ca-certificates/torchkiln-base-ca-0.crt"
        ).read_text() == ca.read_text()
    finally:
        runner.run(engine.command("rm", container))
        engine.remove_image(base.tag)
