"""An arm64 Debian root run under qemu-user, with upstream's aarch64 torch 2.13.0 / torchvision 0.28.0 (cp311,
CUDA 13.0) installed: what `nox -s aarch64` proves torchkiln's aarch64 side on, on an x86_64 machine.

Made once and kept under the test cache (``aarch64/``): qemu-aarch64 registered with binfmt_misc (the
``qemu-user-static`` and ``binfmt-support`` packages; the kernel then runs arm64 binaries through qemu),
``debootstrap --arch=arm64 --variant=minbase bookworm`` (Python 3.11, venv), upstream's aarch64 wheels and
torchkiln's own dependencies downloaded here by pip for ``manylinux_2_*_aarch64`` and installed in the root by
its own pip. Commands run through ``chroot`` in a private mount namespace (``unshare --mount``): /dev, /proc and
the checkout (at /src, torchkiln imported from /src/src) are mounted for them and vanish with them.

/sys is *not* mounted: with the host's /sys, PyTorch's cpuinfo reads an x86_64 machine's CPU topology and the
first tensor operation dies with SIGSEGV under qemu 7.2 (seen here); without it cpuinfo falls back and the
CPU kernels run.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import tomli_w

from kit import realtrees
from kit.deployroot import chroot_run, root_problems
from torchkiln.images.platforms import platform_named
from torchkiln.recipe.loader import load_recipe
from torchkiln.shipped import tomllib

SUITE = "bookworm"
ARCHIVE = "http://deb.debian.org/debian"
PATH = "/opt/venv/bin:/usr/local/bin:/usr/bin:/bin"
# Upstream's aarch64 pair, `===` so that pip takes upstream's +cu130 build, and what torchkiln's verify imports.
PAIR = ("torch===2.13.0", "torchvision===0.28.0")
TORCHKILN_DEPS = ("packaging", "rich", "tomli-w", "cyclonedx-python-lib", "cryptography", "pyelftools")
SUITE_DEPS = ("pytest", "pytest-timeout", "numpy")
# pip takes a wheel only for a platform tag it is given: the manylinux versions the aarch64 wheels carry.
PLATFORMS = [f"manylinux_2_{n}_aarch64" for n in range(17, 29)] + ["manylinux2014_aarch64", "linux_aarch64"]
# verify's areas run in one go under emulation: all but ddp, whose torchrun launches (two workers, each
# importing torch under qemu) take longer than verify's 120 s DDP deadline here (all five ran into it); one
# launch, with a longer deadline, is test_emulated.py's (161 s on 2 shared cores).
AREAS_BUT_DDP = (
    "build_config",
    "cuda_visibility",
    "cudnn_determinism",
    "amp",
    "reproducibility",
    "torchvision",
    "release",
)
BINFMT = Path("/proc/sys/fs/binfmt_misc")


def cache() -> Path:
    return realtrees.cache_dir() / "aarch64"


def problems() -> list[str]:
    """Why this machine cannot make or run the root (empty: it can)."""
    tools = ("debootstrap", "unshare", "chroot", "qemu-aarch64-static", "update-binfmts")
    return root_problems(tools, "qemu-user-static binfmt-support debootstrap")


def register_qemu() -> None:
    """qemu-aarch64 registered with binfmt_misc: mount the file system where it is not, then binfmt-support's
    update-binfmts (the entry qemu-user-static ships)."""
    if not (BINFMT / "register").exists():
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], check=True)
    if not (BINFMT / "qemu-aarch64").exists():
        subprocess.run(["update-binfmts", "--enable", "qemu-aarch64"], check=True)
    assert (BINFMT / "qemu-aarch64").read_text().startswith("enabled"), (
        "qemu-aarch64 is registered but disabled"
    )


def download_wheels(into: Path) -> None:
    """The aarch64 wheels the root installs, downloaded on this machine (pip's cache keeps them)."""
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--only-binary=:all:",
        "--python-version",
        "3.11",
    ]
    subprocess.run([*argv, *platforms, "-d", str(into), *PAIR, *TORCHKILN_DEPS, *SUITE_DEPS], check=True)


def make_root() -> Path:
    """The root, made once (complete or absent: made under a temporary name, renamed when it works)."""
    root = cache() / "root"
    if (root / ".complete").is_file():
        return root
    register_qemu()
    tmp = cache() / "root.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    deb = [
        "debootstrap",
        "--arch=arm64",
        "--variant=minbase",
        "--include=python3,python3-venv,ca-certificates",
    ]
    subprocess.run([*deb, SUITE, str(tmp), ARCHIVE], check=True, stdout=subprocess.DEVNULL)
    download_wheels(tmp / "wheels")
    install = "python3 -m venv /opt/venv && /opt/venv/bin/pip install -q --no-index --find-links /wheels "
    done = run(
        tmp, install + " ".join(f"'{r}'" for r in (*PAIR, *TORCHKILN_DEPS, *SUITE_DEPS)), checkout=None
    )
    assert done.returncode == 0, done.stdout[-3000:]
    shutil.rmtree(tmp / "wheels")
    (tmp / ".complete").write_text("")
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)
    return root


def run(
    root: Path, script: str, *, checkout: Path | None, timeout: float = 1800
) -> subprocess.CompletedProcess[str]:
    """``script`` (sh) in the root as root, in a clean environment, the checkout at /src when given;
    stdout and stderr together."""
    (root / "etc" / "hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {socket.gethostname()}\n")
    shutil.copyfile("/etc/resolv.conf", root / "etc" / "resolv.conf")
    mounts = ['mount --rbind /dev "$1/dev"', 'mount -t proc proc "$1/proc"']
    if checkout is not None:
        (root / "src").mkdir(exist_ok=True)
        mounts.append(f'mount --bind "{checkout}" "$1/src"')
    env = [
        "HOME=/root",
        f"PATH={PATH}",
        "LANG=C.UTF-8",
        "PYTHONPATH=/src/src",
        "CI=" + os.environ.get("CI", ""),
        # qemu-user modelling Grace's 128-bit SVE (data/compat.toml qemu_cpu): at qemu's default 512-bit vectors
        # the NVPL sgemm of upstream's aarch64 wheel gives wrong results (a 3x4 x @ x.T: trace 80, not 506)
        "QEMU_CPU=" + platform_named("aarch64").qemu_cpu,
    ]
    return chroot_run(root, mounts, env, script, timeout)


CONTROL_SCRIPT = """
import json, sys
from torchkiln.recipe.loader import load_recipe
from torchkiln.verify import buildconfig
facts = buildconfig.collect_facts()
out = {}
for path in sys.argv[1:]:
    checks = buildconfig.recipe_checks(load_recipe(path), facts)
    out[path] = sorted(c.field for c in checks.values() if c.status == "fail")
print("RESULT " + json.dumps(out))
"""

# One field of the aarch64 reference recipe changed each (a value the recipe rules still accept on aarch64),
# and the field the comparison must then fail on.
CONTROLS: dict[str, tuple[tuple[str, str, object], str]] = {
    "blas-openblas": (("blas", "kind", "openblas"), "blas.kind"),
    "arch-without-thor": (
        ("accelerator", "arch_list", ["8.0", "9.0", "10.0", "12.0"]),
        "accelerator.arch_list",
    ),
    "with-magma": (
        ("magma", "version", "2.6.1"),
        "magma",
    ),
    "cudnn": (("accelerator", "cudnn", "9.19.0.56"), "accelerator.cudnn"),
}


def write_controls(dest: Path, reference: Path, x86_reference: Path) -> tuple[Path, dict[str, Path]]:
    """The controls' script and the recipes it compares, all in ``dest`` (one directory to mount): by name,
    ``reference`` (must pass), ``x86_64`` (upstream's x86_64 recipe of the release) and each of CONTROLS."""
    dest.mkdir(parents=True, exist_ok=True)
    base = tomllib.loads(reference.read_text())
    recipes = {"reference": dest / "reference.toml", "x86_64": dest / "x86_64.toml"}
    shutil.copyfile(reference, recipes["reference"])
    shutil.copyfile(x86_reference, recipes["x86_64"])
    for name, ((table, key, value), _) in CONTROLS.items():
        doc = json.loads(json.dumps(base))
        doc.setdefault(table, {})[key] = value
        if table == "magma":
            doc["magma"]["sha256"] = "6cd83808c6e8bc7a44028e05112b3ab4e579bcc73202ed14733f66661127e213"
        recipes[name] = dest / f"{name}.toml"
        recipes[name].write_text(tomli_w.dumps(doc))
        load_recipe(recipes[name])  # each control is a recipe the rules accept
    script = dest / "controls.py"
    script.write_text(CONTROL_SCRIPT)
    return script, recipes


def check_controls(output: str, seen: dict[str, str]) -> None:
    """The script's result: the reference recipe passes, each control fails on its field and nothing else,
    the x86_64 recipe fails on the platform, the BLAS and the arch list. ``seen``: name -> path as passed."""
    result = json.loads(output.split("RESULT ", 1)[1].splitlines()[0])
    assert result[seen["reference"]] == [], result
    for name, (_, field) in CONTROLS.items():
        # by its field alone (one recipe field can fail several checks: `cudnn` without `cudnn_runtime` is
        # both the cuDNN compiled against and the one shipped)
        assert set(result[seen[name]]) == {field}, (name, result[seen[name]])
    x86 = result[seen["x86_64"]]
    assert {"build.platform", "blas.kind", "accelerator.arch_list"} <= set(x86), x86
