"""Which machine an image is for, and whether this host can build it.

A recipe's ``build.platform`` (``x86_64``, ``aarch64``) names the machine its wheels run on; the images of that
recipe are for the same machine: ``linux/amd64`` or ``linux/arm64`` (data/compat.toml's ``oci_platform``),
passed to the engine as ``--platform``. An engine on another kind of host builds such an image by running its
``RUN`` steps through qemu-user, which the kernel starts for foreign binaries once qemu is registered with
binfmt_misc (Debian's ``qemu-user-static`` and ``binfmt-support``; docker's ``tonistiigi/binfmt`` does the same).
Without that registration the first ``RUN`` fails with "exec format error" after the base is made; this module
says so before anything runs.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

from torchkiln.recipe import compat
from torchkiln.recipe.model import Recipe

BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")


@dataclass(frozen=True)
class ImagePlatform:
    """The machine a recipe's images are for: its OCI name, Debian's name, what ``uname -m`` says there and the
    CUDA toolkit's ``targets/`` directory on it."""

    name: str  # build.platform: x86_64, aarch64
    oci: str  # linux/amd64, linux/arm64
    deb_arch: str  # amd64, arm64 (debootstrap --arch)
    machines: tuple[str, ...]  # platform.machine() on such a host
    toolkit_target: str  # x86_64-linux, sbsa-linux
    qemu_cpu: str  # QEMU_CPU for qemu-user emulating it (data/compat.toml: Grace's 128-bit SVE for aarch64)

    @property
    def native(self) -> bool:
        """Whether this host is such a machine (then nothing is emulated)."""
        return platform.machine() in self.machines


def platform_named(name: str) -> ImagePlatform:
    """The platform ``name`` (a ``build.platform`` value) from its ``[platform.<name>]`` table."""
    data = compat.compat()["platform"][name]
    return ImagePlatform(
        name,
        data["oci_platform"],
        data["deb_arch"],
        tuple(data["machines"]),
        data["toolkit_target"],
        data["qemu_cpu"],
    )


def image_platform(recipe: Recipe) -> ImagePlatform:
    """The platform of ``recipe``'s images (the schema admits only platforms data/compat.toml has)."""
    return platform_named(recipe.build.platform)


def image_platforms() -> list[ImagePlatform]:
    """Every platform images are made for (``images = true``)."""
    return [platform_named(name) for name in compat.image_platforms()]


def emulation_problem(target: ImagePlatform) -> str | None:
    """Why this host cannot run ``target``'s binaries (None: it can: it is such a machine, or qemu-user is
    registered for it with binfmt_misc)."""
    if target.native:
        return None
    # what qemu-user-static registers (update-binfmts' name): qemu-aarch64
    entry = f"qemu-{target.machines[0]}"
    registered = (BINFMT_DIR / entry).is_file()
    if registered and (BINFMT_DIR / entry).read_text().startswith("enabled"):
        return None
    state = "registered but disabled" if registered else "not registered with binfmt_misc"
    return (
        f"{target.oci} images on this {platform.machine()} host run their RUN steps through qemu-user, and "
        f"{entry} is {state} (valid: apt-get install qemu-user-static binfmt-support, then "
        f"update-binfmts --enable {entry}; or build on a {target.name} host)"
    )
