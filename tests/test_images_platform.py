"""Images for the recipe's machine (issue 22): an aarch64 recipe's images are linux/arm64, on a base debootstrap
makes for arm64 (Ubuntu's from its ports archive), with the toolkit laid out for sbsa-linux; --platform must be
the recipe's; a devel image that cannot install the recipe's BLAS (NVPL) is refused by name while its runtime
image is made; a host that cannot run arm64 binaries is told so before anything runs. The images themselves are
built under emulation by tests/test_images_arm64.py (in CI's tests session; in full by `nox -s aarch64`)."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
from kit import ROOT
from kit.imagekit import need

from torchkiln.cli import main
from torchkiln.errors import TorchkilnError, UsageError
from torchkiln.images import engines, platforms
from torchkiln.images.bake import bake_document
from torchkiln.images.platforms import emulation_problem, platform_named
from torchkiln.recipe.compat import image_platforms, image_problem
from torchkiln.recipe.loader import load_recipe

RECIPES = ROOT / "recipes"
ARM_OPENBLAS = RECIPES / "torch-2.13-cu130-py311-aarch64-openblas.toml"
ARM_NVPL = RECIPES / "torch-2.13-cu130-py312-aarch64.toml"
X86 = RECIPES / "torch-2.13-cu130-py312.toml"
X86_CPU = RECIPES / "torch-2.13-cpu-py311.toml"


def printed(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[str, list[str]]:
    """`torchkiln images ... --print`: (the base line, the build argv's words)."""
    assert main(["images", *args, "--engine", "buildah", "--print"]) == 0
    out = capsys.readouterr().out.splitlines()
    base = next((line for line in out if line.startswith("# base image ")), "")
    return base, out[-1].split()


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["images", *args, "--engine", "buildah", "--print"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip()


def value(argv: list[str], flag: str, name: str = "") -> str:
    """The value after ``flag`` (with ``name=`` for --build-arg)."""
    for i, word in enumerate(argv[:-1]):
        if word == flag and argv[i + 1].startswith(name):
            return argv[i + 1][len(name) :]
    raise AssertionError(f"no {flag} {name} in {argv}")


def test_an_aarch64_recipe_gets_arm64_images_on_an_arm64_base(capsys: pytest.CaptureFixture[str]) -> None:
    base, argv = printed(
        capsys, "--recipe", str(ARM_OPENBLAS), "--target", "devel", "--base-from", "debootstrap"
    )
    assert value(argv, "--platform") == "linux/arm64"
    assert value(argv, "--tag") == "localhost/torchkiln:2.13.0-cu130-arm64-devel"
    assert value(argv, "--build-arg", "KILN_TOOLKIT_TARGET=") == "sbsa-linux"
    # built through qemu on this x86_64 host: the RUN steps may mount (the runtime image's sanity gate hides
    # the host's CPUs from torch: scripts/install_wheels.sh); natively they get nothing extra
    assert ("CAP_SYS_ADMIN" in argv) == (platform.machine() != "aarch64")
    assert (
        "debootstrap --arch=arm64 --variant=minbase" in base
        and " bookworm ROOT http://deb.debian.org/debian" in base
    )
    assert value(argv, "--build-arg", "BASE_IMAGE=") in base and "debian12-bookworm-arm64-" in base

    # the same for x86_64, spelled out: linux/amd64, an amd64 base, the x86_64-linux toolkit, the tag as before
    base, argv = printed(capsys, "--recipe", str(X86), "--target", "devel", "--base-from", "debootstrap")
    assert value(argv, "--platform") == "linux/amd64"
    assert value(argv, "--tag") == "localhost/torchkiln:2.13.0-cu130-devel"
    assert value(argv, "--build-arg", "KILN_TOOLKIT_TARGET=") == "x86_64-linux"
    assert ("CAP_SYS_ADMIN" in argv) == (platform.machine() != "x86_64")
    assert "debootstrap --arch=amd64 " in base and " noble ROOT http://archive.ubuntu.com/ubuntu" in base
    _, argv = printed(capsys, "--recipe", str(X86_CPU), "--target", "devel")
    assert value(argv, "--build-arg", "KILN_TOOLKIT_TARGET=") == ""  # no toolkit in a CPU image


def test_ubuntus_arm64_base_comes_from_its_ports_archive(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Python 3.12 is Ubuntu 24.04's; its arm64 packages are on ports.ubuntu.com, not archive.ubuntu.com."""
    recipe = tmp_path / "arm-py312.toml"
    recipe.write_text(ARM_NVPL.read_text().replace('kind = "nvpl"', 'kind = "openblas"'))
    base, _ = printed(capsys, "--recipe", str(recipe), "--target", "devel", "--base-from", "debootstrap")
    assert "--arch=arm64" in base and " noble ROOT http://ports.ubuntu.com/ubuntu-ports" in base


@pytest.mark.parametrize(
    ("recipe", "given", "machine", "images"),
    [(ARM_OPENBLAS, "linux/amd64", "aarch64", "linux/arm64"), (X86, "linux/arm64", "x86_64", "linux/amd64")],
    ids=["aarch64-recipe-as-amd64", "x86_64-recipe-as-arm64"],
)
def test_platform_must_be_the_recipes(
    capsys: pytest.CaptureFixture[str], recipe: Path, given: str, machine: str, images: str
) -> None:
    message = refused(capsys, "--recipe", str(recipe), "--platform", given, "--target", "devel")
    assert message == (
        f"--platform {given}: {recipe} is a build.platform = {machine!r} recipe, whose images are {images} "
        f"(valid: --platform {images}, or a recipe whose build.platform is the machine you want)"
    )
    _, argv = printed(capsys, "--recipe", str(recipe), "--platform", images, "--target", "devel")
    assert value(argv, "--platform") == images


@pytest.mark.parametrize("flavour", ["devel", "wheels"])
def test_an_nvpl_recipe_gets_no_devel_or_wheels_image_naming_blas_kind(
    capsys: pytest.CaptureFixture[str], flavour: str
) -> None:
    message = refused(capsys, "--recipe", str(ARM_NVPL), "--target", flavour)
    assert message.startswith(
        f"{ARM_NVPL}: blas.kind: the {flavour} image of a recipe for aarch64 cannot install 'nvpl'"
    )
    assert "(valid: 'openblas';" in message
    assert (
        image_problem(load_recipe(ARM_NVPL), "runtime") is None
    )  # the wheel bundles NVPL: nothing to install
    assert image_platforms() == ["x86_64", "aarch64"]


def test_bake_builds_each_recipe_for_its_platform() -> None:
    """Every target says its platform; the NVPL recipe has no wheels stage for a runtime target to take wheels
    from, so it has no targets at all."""
    doc = bake_document([load_recipe(p) for p in (ARM_OPENBLAS, ARM_NVPL, X86)])
    targets = doc["target"]
    arm = "torch-2_13-cu130-py311-aarch64-openblas"
    assert sorted(targets) == sorted(
        f"{name}-{flavour}"
        for name in (arm, "torch-2_13-cu130-py312")
        for flavour in ("devel", "wheels", "runtime")
    )
    assert {targets[f"{arm}-{f}"]["platforms"][0] for f in ("devel", "wheels", "runtime")} == {"linux/arm64"}
    assert targets["torch-2_13-cu130-py312-runtime"]["platforms"] == ["linux/amd64"]
    assert targets[f"{arm}-runtime"]["tags"] == ["${REGISTRY}/torchkiln:2.13.0-cu130-arm64-runtime"]


def test_a_host_that_cannot_run_arm64_binaries_is_told_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """binfmt_misc is the kernel's (the boundary faked here): no qemu-aarch64 entry, a disabled one, an
    enabled one; a native host needs none."""
    arm = platform_named("aarch64")
    monkeypatch.setattr(platforms, "BINFMT_DIR", tmp_path)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    missing = emulation_problem(arm)
    assert missing == (
        "linux/arm64 images on this x86_64 host run their RUN steps through qemu-user, and qemu-aarch64 is not "
        "registered with binfmt_misc (valid: apt-get install qemu-user-static binfmt-support, then "
        "update-binfmts --enable qemu-aarch64; or build on a aarch64 host)"
    )
    (tmp_path / "qemu-aarch64").write_text(
        "disabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\n"
    )
    assert "qemu-aarch64 is registered but disabled" in (emulation_problem(arm) or "")
    (tmp_path / "qemu-aarch64").write_text("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\n")
    assert emulation_problem(arm) is None
    assert emulation_problem(platform_named("x86_64")) is None  # native: nothing to emulate


def test_the_command_refuses_an_arm64_image_before_the_base_is_made_or_the_engine_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command is refused before the base is made or the engine runs (no --print); ``--engine buildah``
    is looked up first, so this part needs buildah installed (skipped without it, failed under CI=true)."""
    need("buildah")
    monkeypatch.setattr(platforms, "BINFMT_DIR", tmp_path)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    missing = emulation_problem(platform_named("aarch64"))
    assert missing is not None and "qemu-aarch64 is not registered with binfmt_misc" in missing
    storage = tmp_path / "storage"
    argv = ["images", "--recipe", str(ARM_OPENBLAS), "--target", "devel", "--engine", "buildah"]
    assert main([*argv, "--storage-root", str(storage), "--base-from", "debootstrap"]) == 2
    assert capsys.readouterr().err.strip() == missing
    assert not storage.exists()


def test_an_emulated_run_hides_the_host_cpus_and_keeps_the_command_words_as_arguments() -> None:
    """The wrapper mounts over /sys/devices/system/cpu as root, then runs the command as the image's user;
    the command's words are positional arguments of a fixed script (never parsed by the shell). Docker and
    podman refuse an emulated run by name (buildah is the engine that does it). The real runs are in
    tests/test_images_arm64.py."""
    command = ["python", "-c", "print('$(touch /x); `id`')"]
    root = engines._without_host_cpus(command, "")
    assert root == ["sh", "-c", engines.HIDE_HOST_CPUS + '; exec "$@"', "sh", *command]
    user = engines._without_host_cpus(command, "10001:10001")
    assert user[:2] == ["sh", "-c"] and user[3:] == ["sh", *command]
    assert "setpriv --reuid=10001 --regid=10001 --clear-groups" in user[2] and "$(touch" not in user[2]
    with pytest.raises(UsageError, match="needs a numeric UID"):
        engines._without_host_cpus(command, "kiln")
    with pytest.raises(TorchkilnError, match="valid: --engine buildah"):
        engines.Docker("docker").run("img", ["true"], qemu_cpu="max")
