"""A deployment root: what a node that only runs wheels has (tests/test_deploy.py).

Debian bookworm made by ``debootstrap --variant=minbase --include=python3,python3-venv`` (the distribution's
essential packages, apt, and a Python with venv and ensurepip's bundled pip): no compiler, no CUDA toolkit,
no -dev package, no library of the build host. Made once and kept in the test cache (``deploy/bookworm``,
complete or absent); a run copies it (hard links would let a test change the cached root: ``cp -a``) into
its own directory, so every test starts from the same root.

Wheels are installed into it with plain ``pip install --no-index --find-links``: pip resolves the wheels' own
Requires-Dist from a wheelhouse downloaded on this machine (``deploy/wheels``, upstream's wheels from the
package index, kept in the test cache; bookworm's glibc and Python 3.11 are this machine's, so pip picks the
same wheels for both), and nothing is fetched while the root runs. Commands run through ``chroot`` in a
private mount namespace (``unshare --mount``): /dev, /proc, the checkout at /src (torchkiln imported from
/src/src, for verify) and the given directories read-only, all gone when the command ends.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from kit import ROOT, realtrees
from kit.cachelock import exclusive
from kit.imagekit import require
from torchkiln.shipped import tomllib

SUITE = "bookworm"
ARCHIVE = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
PACKAGES = ("python3", "python3-venv")
PATH = "/opt/venv/bin:/usr/local/bin:/usr/bin:/bin"


def _runtime_dependencies() -> tuple[str, ...]:
    """torchkiln's own dependencies as pyproject.toml declares them (so the root cannot lag behind a new
    one, as it did when verify's library check began to read auditwheel's policies)."""
    with (ROOT / "pyproject.toml").open("rb") as handle:
        declared = tomllib.load(handle)["project"]["dependencies"]
    return tuple(req for req in declared if "python_version <" not in req)  # the root's Python is 3.11


# What torchkiln's verify imports, and its suite runs with (torchkiln itself comes from the checkout).
VERIFY_DEPS = (*_runtime_dependencies(), "pytest", "pytest-timeout")


def cache() -> Path:
    return realtrees.cache_dir() / "deploy"


def root_problems(tools: Sequence[str], install: str) -> list[str]:
    """Why this machine cannot make or run a debootstrapped root that needs ``tools`` (apt's ``install``
    packages hold them); empty: it can."""
    found = [] if os.geteuid() == 0 else ["needs root (debootstrap, chroot, mounts)"]
    return found + [f"no {tool} (apt-get install {install})" for tool in tools if shutil.which(tool) is None]


def problems() -> list[str]:
    """Why this machine cannot make or run the root (empty: it can)."""
    found = root_problems(("debootstrap", "unshare", "chroot"), "debootstrap util-linux coreutils")
    if not Path(KEYRING).is_file():
        found.append(f"no {KEYRING} (apt-get install debian-archive-keyring)")
    return found


def cached_root() -> Path:
    """The root as debootstrap made it, once (complete or absent: made under a temporary name, renamed)."""
    require(not problems(), "; ".join(problems()))
    root = cache() / SUITE
    with exclusive(root):
        return _made_root(root)


def _made_root(root: Path) -> Path:
    if (root / ".complete").is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{SUITE}."))
    try:
        argv = ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", f"--keyring={KEYRING}"]
        done = subprocess.run(
            [*argv, SUITE, str(tmp / "root"), ARCHIVE], capture_output=True, text=True, check=False
        )
        require(done.returncode == 0, f"debootstrap: {done.stdout[-1500:]}{done.stderr[-1500:]}")
        (tmp / "root" / ".complete").write_text(" ".join(argv) + "\n")
        shutil.rmtree(root, ignore_errors=True)
        os.replace(tmp / "root", root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def fresh_root(into: Path) -> Path:
    """A copy of the cached root at ``into`` (a test's own: what it installs there is gone with it)."""
    subprocess.run(["cp", "-a", "--", str(cached_root()), str(into)], check=True)
    return into


def wheelhouse(requirements: Sequence[str]) -> Path:
    """``requirements`` and everything they require, as wheels for this machine's Python (3.11, bookworm's),
    downloaded once into the test cache (pip's own cache makes a second download quick)."""
    key = hashlib.sha256("\n".join(sorted(requirements)).encode()).hexdigest()[:16]
    target = cache() / f"wheels-{key}"
    with exclusive(target):
        return _downloaded(target, key, requirements)


def _downloaded(target: Path, key: str, requirements: Sequence[str]) -> Path:
    if (target / ".complete").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".wheels-{key}."))
    try:
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "-d", str(tmp)]
        done = subprocess.run([*argv, *requirements], capture_output=True, text=True, check=False)
        require(done.returncode == 0, f"pip download {' '.join(requirements)}: {done.stderr[-1500:]}")
        (tmp / ".complete").write_text("\n".join(requirements) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def run(
    root: Path, script: str, *, binds: Mapping[str, Path] = {}, timeout: float = 1200
) -> subprocess.CompletedProcess[str]:
    """``script`` (sh) in the root as root, in a clean environment (PATH with the root's /opt/venv), with the
    checkout at /src and each of ``binds`` (path in the root -> directory here) read-only; output and errors
    together. No network is needed: the root has no resolver configuration."""
    (root / "src").mkdir(exist_ok=True)
    mounts = [
        'mount --rbind /dev "$1/dev"',
        'mount -t proc proc "$1/proc"',
        f'mount --bind "{ROOT}" "$1/src"',
    ]
    for inside, outside in binds.items():
        (root / inside.lstrip("/")).mkdir(parents=True, exist_ok=True)
        mounts += [f'mount --bind "{outside}" "$1{inside}"', f'mount -o remount,ro,bind "$1{inside}"']
    env = ["HOME=/root", f"PATH={PATH}", "LANG=C.UTF-8", "PYTHONPATH=/src/src", "PIP_NO_INDEX=1"]
    env += ["PIP_DISABLE_PIP_VERSION_CHECK=1", "CI=" + os.environ.get("CI", "")]
    return chroot_run(root, mounts, env, script, timeout)


def chroot_run(
    root: Path, mounts: Sequence[str], env: Sequence[str], script: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``script`` (sh) chrooted into ``root`` in a mount namespace of its own, after ``mounts`` (shell
    commands, ``$1`` the root), with only ``env``; stdout and stderr together."""
    argv = [
        "unshare", "--mount", "--propagation", "private", "--", "bash", "-c",
        " && ".join(mounts) + ' && cd / && exec chroot "$1" /usr/bin/env -i "${@:2}"',
        "chroot-run", str(root), *env, "/bin/sh", "-c", script,
    ]  # fmt: skip
    return subprocess.run(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
        timeout=timeout, check=False,
    )  # fmt: skip
