"""A base image made on this host where no registry is reachable (torchkiln.images.rootfs): ``torchkiln images
--base-from debootstrap`` and ``--base-rootfs DIR|TAR``, what they print, how the base is tagged, what they
refuse. The real debootstrap and import run in the image tests (tests/conftest.py makes every image test's
base with them; tests/test_images_build.py imports a tar)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit import ROOT

from torchkiln import cli
from torchkiln.errors import UsageError
from torchkiln.images import rootfs
from torchkiln.images.platforms import platform_named
from torchkiln.recipe.image_bases import DISTROS

CPU = ROOT / "recipes" / "torch-2.13-cpu-py311.toml"
CU130 = ROOT / "recipes" / "torch-2.14-cu130-py312.toml"
# The shape of a PEM certificate: what --base-ca checks for (the tag hashes the bytes).
PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


X86 = platform_named("x86_64")  # the recipes here are x86_64 ones


def images(*args: str) -> list[str]:
    return ["images", "--engine", "buildah", "--print", *args]


def test_base_from_debootstrap_prints_the_debootstrap_and_builds_on_its_tag_without_pulling(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(images("--recipe", str(CPU), "--base-from", "debootstrap")) == 0
    first, command = capsys.readouterr().out.splitlines()
    tag = rootfs.plan_debootstrap("debian12", DISTROS["debian12"], archive=None, cas=(), target=X86).tag
    assert tag.startswith("localhost/torchkiln-base:debian12-bookworm-")
    assert first == (
        f"# base image {tag}: made by `debootstrap --arch=amd64 --variant=minbase "
        "--keyring=/usr/share/keyrings/debian-archive-keyring.gpg bookworm ROOT http://deb.debian.org/debian` "
        "unless the engine has it (FROM scratch, ADD rootfs.tar /)"
    )
    assert f"--build-arg BASE_IMAGE={tag} " in command and " --pull=never " in command
    # Python 3.12 with the toolkit from PyPI: Ubuntu 24.04's root, from Ubuntu's archive, with its keyring
    assert cli.main(images("--recipe", str(CU130), "--base-from", "debootstrap")) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert (
        "--keyring=/usr/share/keyrings/ubuntu-archive-keyring.gpg noble ROOT http://archive.ubuntu.com/ubuntu`"
        in first
    )


def test_the_debootstrapped_base_is_tagged_by_what_it_is_made_from(tmp_path: Path) -> None:
    ca = tmp_path / "proxy.crt"
    ca.write_text(PEM)
    debian = DISTROS["debian12"]

    def tag(archive: str | None = None, cas: tuple[str, ...] = ()) -> str:
        return rootfs.plan_debootstrap("debian12", debian, archive=archive, cas=cas, target=X86).tag

    assert tag() == tag()
    with_ca = tag(cas=(str(ca),))
    assert len({tag(), tag("http://mirror.example/debian"), with_ca}) == 3
    ca.write_text(PEM.replace("MIIB", "MIIC"))
    assert tag(cas=(str(ca),)) != with_ca  # another certificate, another base


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--base-from", "debootstrap", "--base-image", "x:1"], "--base-image and --base-from debootstrap both name the base"),
        (["--base-rootfs", "ROOTFS", "--base-image", "x:1"], "--base-image and --base-rootfs both name the base"),
        (["--base-from", "debootstrap", "--base-rootfs", "ROOTFS"], "--base-from debootstrap and --base-rootfs both name"),
        (["--debootstrap-mirror", "http://m/debian"], "--debootstrap-mirror is only used with --base-from debootstrap"),
        (["--base-rootfs", "ROOTFS", "--debootstrap-mirror", "http://m/d"], "--debootstrap-mirror is only used with"),
        (["--base-ca", "CA"], "--base-ca is only used with --base-from debootstrap or --base-rootfs"),
        (["--base-rootfs", "NOTAR"], "--base-rootfs NOTAR: not a directory or a tar (valid: a root filesystem's"),
        (["--base-rootfs", "ROOTFS", "--base-ca", "NOTPEM"], "--base-ca NOTPEM: no PEM certificate in it"),
        (["--base-rootfs", "ROOTFS", "--base-ca", "ABSENT"], "--base-ca ABSENT: no such file"),
        (
            ["--base-from", "debootstrap", "--recipe-cuda-nvidia"],
            "debootstrap cannot make (valid: --cuda-from pypi, where torchkiln knows the recipe's CUDA on PyPI",
        ),
    ],
)  # fmt: skip
def test_base_options_that_conflict_or_go_unused_are_refused_naming_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    files = {
        "ROOTFS": tmp_path / "rootfs",
        "NOTAR": tmp_path / "rootfs.zip",
        "CA": tmp_path / "ca.crt",
        "NOTPEM": tmp_path / "notes.txt",
        "ABSENT": tmp_path / "absent.crt",
    }
    files["ROOTFS"].mkdir()
    files["NOTAR"].write_bytes(b"PK")
    files["CA"].write_text(PEM)
    files["NOTPEM"].write_text("not a certificate\n")
    recipe = ["--recipe", str(CPU)]
    if "--recipe-cuda-nvidia" in args:
        args = [a for a in args if a != "--recipe-cuda-nvidia"]
        recipe = ["--recipe", str(CU130), "--cuda-from", "nvidia"]
    argv = [str(files[a]) if a in files else a for a in args]
    assert cli.main(images(*recipe, *argv)) == 2
    err = capsys.readouterr().err
    assert (
        message.replace("NOTAR", str(files["NOTAR"]))
        .replace("NOTPEM", str(files["NOTPEM"]))
        .replace("ABSENT", str(files["ABSENT"]))
        in err
    ), err
    assert "Traceback" not in err


def test_a_given_root_is_imported_as_a_base_of_its_own_with_the_ca(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tar = tmp_path / "root.tar.xz"
    tar.write_bytes(b"")
    ca = tmp_path / "proxy.crt"
    ca.write_text(PEM)
    assert cli.main(images("--recipe", str(CPU), "--base-rootfs", str(tar), "--base-ca", str(ca))) == 0
    first, command = capsys.readouterr().out.splitlines()
    base = rootfs.plan_rootfs(str(tar), cas=[str(ca)], target=X86)
    assert base.tag.startswith("localhost/torchkiln-base:rootfs-") and base.rootfs == tar
    assert (
        first
        == f"# base image {base.tag}: imported from {tar}, with CA certificates {ca} (FROM scratch, ADD rootfs.tar /)"
    )
    assert f"--build-arg BASE_IMAGE={base.tag} " in command and " --pull=never " in command


def test_debootstrap_says_what_it_lacks_before_running(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Not root, no keyring: both named with the way out, and nothing runs (a user without root, a Debian
    host without Ubuntu's keyring for a Python 3.12 recipe's noble root)."""
    deb = rootfs.Debootstrap(
        "noble", "http://archive.ubuntu.com/ubuntu", tmp_path / "ubuntu-archive-keyring.gpg", "amd64"
    )
    monkeypatch.setattr(rootfs.os, "geteuid", lambda: 1000)  # the boundary: who runs this
    with pytest.raises(UsageError) as raised:
        rootfs.make_root(deb, tmp_path / "root")
    message = str(raised.value)
    assert message.startswith("--base-from debootstrap: debootstrap needs root: run torchkiln images as root")
    assert (
        f"no {deb.keyring}, the keyring that checks http://archive.ubuntu.com/ubuntu (install ubuntu-keyring"
        in message
    )
    assert not (tmp_path / "root").exists()
