"""A base image made from a local root filesystem, for building images where no registry is reachable.

The devel and runtime images start ``FROM`` the distribution image torchkiln's table picks for a recipe
(``debian:bookworm-slim`` for Python 3.11, ...), which an engine pulls from a registry. Where none is
reachable, the same distribution comes from its apt archive instead: ``--base-from debootstrap`` makes the
root with ``debootstrap --variant=minbase SUITE DIR ARCHIVE`` (the suite, archive and keyring of the recipe's
row in :data:`torchkiln.recipe.image_bases.DISTROS`), and ``--base-rootfs DIR|TAR`` takes a root made elsewhere.
Either is imported into the engine's storage as an image (``FROM scratch``, ``ADD rootfs.tar /``: every
engine builds that the same way, none pulls anything for it), and the recipe's image is built on it without
pulling. CI's image tests build on such a base (tests/conftest.py).

A debootstrapped base is tagged by what it is made from (suite, archive, variant, extra CA certificates), so
the next build reuses it (remove the image to make it again, e.g. for the archive's updates); a given root is
imported again on every run, since what is in it may have changed.

``--base-ca FILE`` puts a CA certificate into the base's ``/usr/local/share/ca-certificates/``: the images'
``ca-certificates`` install adds it to the system bundle, so TLS through an intercepting proxy (a corporate
one, or a sandbox's egress) works in their RUN steps. A certificate is public: nothing secret goes in.
"""

from __future__ import annotations

import os
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torchkiln.errors import TorchkilnError, UsageError
from torchkiln.files.digests import digest, file_sha256
from torchkiln.images.engines import BuildRequest, Engine
from torchkiln.images.platforms import ImagePlatform
from torchkiln.process import runner
from torchkiln.recipe.image_bases import Distro

BASE_REPOSITORY = "localhost/torchkiln-base"
VARIANT = "minbase"  # essential packages and apt only, as the distributions' own slim images
CA_DIR = "/usr/local/share/ca-certificates/"
PEM_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
# What ADD unpacks by itself (docker, podman and buildah alike): a tar, plain or compressed.
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
ROOTFS_VALID = (
    f"a root filesystem's directory (e.g. made by debootstrap) or a tar of one ({', '.join(TAR_SUFFIXES)})"
)


@dataclass(frozen=True)
class Debootstrap:
    """How debootstrap makes a distribution's root: its suite, the archive it fetches from, the keyring that
    checks the archive's signature, and the architecture (Debian's name: amd64, arm64). A foreign one is made in
    both of debootstrap's stages on this host: the second runs the root's own binaries, through qemu-user."""

    suite: str
    archive: str
    keyring: Path
    arch: str

    def argv(self, root: Path) -> list[str]:
        """``--keyring`` explicitly: without the keyring debootstrap would go on unchecked."""
        return [
            "debootstrap",
            f"--arch={self.arch}",
            f"--variant={VARIANT}",
            f"--keyring={self.keyring}",
            self.suite,
            str(root),
            self.archive,
        ]


@dataclass(frozen=True)
class LocalBase:
    """A base image made on this host: by debootstrap, or from a given root (a directory or a tar)."""

    tag: str
    cas: tuple[Path, ...] = ()
    debootstrap: Debootstrap | None = None
    rootfs: Path | None = None
    platform: str = ""  # the OCI platform the image is recorded as (the root's machine)

    def describe(self) -> str:
        """What --print says happens before the build (nothing of it runs there)."""
        made = (
            f"made by `{' '.join(self.debootstrap.argv(Path('ROOT')))}` unless the engine has it"
            if self.debootstrap is not None
            else f"imported from {self.rootfs}"
        )
        extra = f", with CA certificates {', '.join(map(str, self.cas))}" if self.cas else ""
        return f"# base image {self.tag}: {made}{extra} (FROM scratch, ADD rootfs.tar /)"


def _certificates(files: Sequence[str]) -> tuple[Path, ...]:
    out: list[Path] = []
    for given in files:
        path = Path(given)
        if not path.is_file():
            raise UsageError(f"--base-ca {given}: no such file (valid: a PEM CA certificate file)")
        if PEM_CERTIFICATE not in path.read_bytes():
            raise UsageError(
                f"--base-ca {given}: no PEM certificate in it (valid: a PEM CA certificate file)"
            )
        out.append(path.resolve())
    return tuple(out)


def plan_debootstrap(
    key: str, distro: Distro, *, archive: str | None, cas: Sequence[str], target: ImagePlatform
) -> LocalBase:
    """The base debootstrap makes for the distribution ``key`` (a row of DISTROS) for the ``target`` machine,
    tagged by its inputs."""
    arch = target.deb_arch
    deb = Debootstrap(distro.suite, archive or distro.archive_for(arch), Path(distro.keyring), arch)
    certificates = _certificates(cas)
    inputs = [VARIANT, deb.suite, deb.archive, deb.arch, *(file_sha256(c) for c in certificates)]
    tag = f"{BASE_REPOSITORY}:{key}-{deb.suite}-{deb.arch}-{digest(inputs)[:12]}"
    return LocalBase(tag, certificates, deb, platform=target.oci)


def plan_rootfs(given: str, *, cas: Sequence[str], target: ImagePlatform) -> LocalBase:
    """The base imported from the root filesystem ``given`` (a directory or a tar), a root for the ``target``
    machine."""
    path = Path(given)
    if not (path.is_dir() or (path.is_file() and path.name.endswith(TAR_SUFFIXES))):
        raise UsageError(f"--base-rootfs {given}: not a directory or a tar (valid: {ROOTFS_VALID})")
    path = path.resolve()
    certificates = _certificates(cas)
    inputs = [str(path), *(file_sha256(c) for c in certificates)]
    inputs = [*inputs, target.oci]
    return LocalBase(
        f"{BASE_REPOSITORY}:rootfs-{digest(inputs)[:12]}", certificates, rootfs=path, platform=target.oci
    )


def debootstrap_problems(deb: Debootstrap) -> list[str]:
    """Why debootstrap cannot run here (empty: it can): it needs root, itself and the archive's keyring."""
    problems = []
    if os.geteuid() != 0:
        problems.append(
            "debootstrap needs root: run torchkiln images as root (or with sudo), or make the root elsewhere "
            f"(sudo {' '.join(deb.argv(Path('DIR')))}) and pass --base-rootfs DIR"
        )
    if shutil.which("debootstrap") is None:
        problems.append("no debootstrap on PATH (apt-get install debootstrap)")
    if not deb.keyring.is_file():
        package = "ubuntu-keyring" if "ubuntu" in deb.keyring.name else "debian-archive-keyring"
        problems.append(
            f"no {deb.keyring}, the keyring that checks {deb.archive} (install {package}, or pass "
            "--base-rootfs with a root made where it is)"
        )
    return problems


def make_root(deb: Debootstrap, root: Path) -> None:
    """``debootstrap`` into ``root`` (which must not exist yet), its output going to the terminal."""
    problems = debootstrap_problems(deb)
    if problems:
        raise UsageError("--base-from debootstrap: " + "; ".join(problems))
    print(f"torchkiln images: {' '.join(deb.argv(root))}", file=sys.stderr, flush=True)
    done = runner.run(deb.argv(root), capture=False)
    if not done.ok:
        raise TorchkilnError(
            f"debootstrap failed (exit {done.returncode}); its output is above (--debootstrap-mirror URL for "
            "another archive)"
        )


def import_root(engine: Engine, source: Path, tag: str, cas: Sequence[Path] = (), platform: str = "") -> None:
    """Import the root filesystem ``source`` (a directory or a tar) into ``engine``'s storage as ``tag``,
    with the CA certificates ``cas`` added as local ones, recorded as an image for ``platform`` (no RUN step:
    nothing of the root runs)."""
    with tempfile.TemporaryDirectory(prefix="torchkiln-base-") as scratch:
        context = Path(scratch)
        if source.is_dir():
            archive = context / "rootfs.tar"
            with tarfile.open(archive, "w") as tar:
                tar.add(source, arcname=".")
        else:
            archive = context / ("rootfs" + next(s for s in TAR_SUFFIXES if source.name.endswith(s)))
            shutil.copyfile(source, archive)
        lines = ["FROM scratch", f"ADD {archive.name} /"]
        if cas:
            (context / "ca").mkdir()
            for number, certificate in enumerate(cas):
                shutil.copyfile(certificate, context / "ca" / f"torchkiln-base-ca-{number}.crt")
            lines.append(f"COPY ca/ {CA_DIR}")
        (context / "Containerfile").write_text("\n".join([*lines, 'CMD ["/bin/bash"]', ""]))
        request = BuildRequest(
            context / "Containerfile", context, "", (tag,), {}, pull=False, platform=platform
        )
        engine.build(request)


def ensure(engine: Engine, base: LocalBase) -> str:
    """Make ``base`` in ``engine``'s storage (a debootstrapped one only when it is not there yet); its tag."""
    if base.debootstrap is None:
        assert base.rootfs is not None
        import_root(engine, base.rootfs, base.tag, base.cas, base.platform)
        return base.tag
    if engine.image_exists(base.tag):
        print(f"torchkiln images: base {base.tag} (debootstrapped earlier)", file=sys.stderr, flush=True)
        return base.tag
    with tempfile.TemporaryDirectory(prefix="torchkiln-debootstrap-") as scratch:
        root = Path(scratch) / "rootfs"
        try:
            make_root(base.debootstrap, root)
            import_root(engine, root, base.tag, base.cas, base.platform)
        finally:
            unmount_leftovers(root)
    return base.tag


def unmount_leftovers(root: Path) -> None:
    """Unmount what a stopped debootstrap left mounted in ``root`` (it mounts proc and sys while it installs
    packages), so removing the directory never walks into the host's /proc or /sys."""
    for sub in ("dev/pts", "dev", "sys", "proc"):
        if os.path.ismount(root / sub):
            runner.run(["umount", "--lazy", str(root / sub)])
