"""Upstream's real release sources, as test fixtures: PyTorch 2.6.0 and torchvision 0.21.0.

Debian's source packages carry upstream's release tarballs as their ``.orig`` tarballs (PyTorch's is a
``+dfsg`` repack: Debian strips some vendored files; neither has git submodules, like any source archive of a
GitHub release). They are fetched from Debian's pool, checked against the sha256 of Debian's Sources index
(trixie: ``pytorch 2.6.0+dfsg-7``, ``pytorch-vision 0.21.0-3``), kept in a cache directory between runs and
extracted once per test session. Nothing of them is committed.

Where the archive cannot be reached the tests that need them skip; under ``CI=true`` they fail instead
(CI reaches Debian's archive, so a skip there would hide a broken test).

Upstream's wheels from the package index (:func:`pypi_wheel`: torch's CUDA build, setuptools releases) are
kept in the same cache, under ``pypi/``; a CUDA toolkit made from NVIDIA's PyPI wheels
(:func:`cuda_toolkit`, for the tests that compile CUDA on the host), under ``cuda/``.

The cache: ``$TORCHKILN_TEST_CACHE`` or ``~/.cache/torchkiln/test-data``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from kit import ROOT
from kit.cachelock import exclusive
from kit.imagekit import require
from torchkiln.files import shared

ARCHIVE = os.environ.get("TORCHKILN_DEBIAN_MIRROR", "http://deb.debian.org/debian")


@dataclass(frozen=True)
class Tarball:
    """One orig tarball of Debian's pool: its path there, sha256 (Debian's Sources index) and the directory
    it extracts to."""

    pool_path: str
    sha256: str
    top: str

    @property
    def name(self) -> str:
        return self.pool_path.rsplit("/", 1)[1]


PYTORCH_2_6_0 = Tarball(
    "pool/main/p/pytorch/pytorch_2.6.0+dfsg.orig.tar.xz",
    "099a9601bc40d67656e75735c44abedb0fbe92d08817852ab7472eebb7e6ddff",
    "pytorch-v2.6.0",
)
VISION_0_21_0 = Tarball(
    "pool/main/p/pytorch-vision/pytorch-vision_0.21.0.orig.tar.gz",
    "0a4a967bbb7f9810f792cd0289a07fb98c8fb5d1303fae8b63e3a6b05d720058",
    "vision-0.21.0",
)


def cache_dir() -> Path:
    return Path(os.environ.get("TORCHKILN_TEST_CACHE", Path.home() / ".cache" / "torchkiln" / "test-data"))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(tarball: Tarball) -> Path:
    """The tarball in the cache, downloaded (and checked) when it is not there yet."""
    target = cache_dir() / "debian" / tarball.name
    with exclusive(target):
        return _fetched(target, tarball)


def _fetched(target: Path, tarball: Tarball) -> Path:
    if target.is_file() and _sha256(target) == tarball.sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    url = f"{ARCHIVE}/{tarball.pool_path}"
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{tarball.name}.")
    tmp = Path(tmp_name)
    try:
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=120) as response:  # noqa: S310 - fixed https/http URL of Debian's archive
                shutil.copyfileobj(response, out)
        except (urllib.error.URLError, OSError) as exc:
            require(False, f"Debian's archive is not reachable ({url}: {exc})")
        got = _sha256(tmp)
        assert got == tarball.sha256, f"{url}: sha256 {got}, Debian's Sources index says {tarball.sha256}"
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def extract(tarball: Tarball, into: Path) -> Path:
    """The tarball extracted under ``into`` (its top directory)."""
    with tarfile.open(fetch(tarball)) as tar:
        # tarfile's extraction filters came with 3.11.4 (3.10.12); Debian 12's python3 is 3.11.2 without them,
        # and this tarball is the one its sha256 pins, so it is extracted as it is there
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(into, **safe)  # noqa: S202 - pinned by sha256
    tree = into / tarball.top
    assert (tree / "setup.py").is_file(), f"{tarball.name}: no {tarball.top}/setup.py"
    return tree


def pypi_wheel(requirement: str, *, python_version: str | None = None, platform: str | None = None) -> Path:
    """Upstream's wheel for ``requirement`` (pinned with ``==`` or ``===``) as the package index gives it
    (``pip download --no-deps``), kept in the cache under ``pypi/``. Skips where no index answers (fails
    under CI=true). ``python_version``: the Python the wheel is for (default: this one's); ``platform``: the
    platform tag (default: this machine's), e.g. manylinux_2_28_aarch64."""
    key = (
        "".join(c if c.isalnum() or c in ".-" else "_" for c in requirement)
        + (f"-py{python_version}" if python_version else "")
        + (f"-{platform}" if platform else "")
    )
    target = cache_dir() / "pypi" / key
    with exclusive(target):
        return _downloaded(target, key, requirement, python_version, platform)


def _downloaded(
    target: Path, key: str, requirement: str, python_version: str | None, platform: str | None
) -> Path:
    found = sorted(target.glob("*.whl")) if target.is_dir() else []
    if found:
        return found[0]
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{key}."))
    try:
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
        argv += ["--python-version", python_version] if python_version else []
        argv += ["--platform", platform] if platform else []
        done = subprocess.run(
            [*argv, "-d", str(tmp), requirement], capture_output=True, text=True, check=False
        )
        wheels = sorted(tmp.glob("*.whl"))
        require(
            done.returncode == 0 and len(wheels) == 1, f"pip download {requirement}: {done.stderr[-500:]}"
        )
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return next(target.glob("*.whl"))


TORCH_CPU = "torch===2.13.0+cpu"  # upstream's CPU wheel: what `nox -s tests` installs and test builds check


def pypi_wheel_in(directory: Path, requirement: str = TORCH_CPU) -> Path:
    """:func:`pypi_wheel`'s wheel for this Python copied into ``directory`` (made if missing): a test's own
    wheelhouse or dist/, which it may change, while the download is the cache's, one for every test."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    directory.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy2(pypi_wheel(requirement, python_version=python), directory))


def pypi_venv(requirement: str, *, extra: tuple[str, ...] = ()) -> Path:
    """A venv (this Python) with upstream's wheel for ``requirement`` and its dependencies installed, plus
    ``extra``, kept in the cache under ``venvs/`` (built once: torch 2.6.0's CUDA libraries are gigabytes;
    pip's own cache makes a rebuild quicker). Returns its python. Skips where no index answers (fails under
    CI=true)."""
    wheel = pypi_wheel(requirement, python_version=f"{sys.version_info.major}.{sys.version_info.minor}")
    key = "-".join("".join(c if c.isalnum() or c in ".-" else "_" for c in r) for r in (requirement, *extra))
    target = cache_dir() / "venvs" / key
    with exclusive(target):
        return _installed(target, wheel, requirement, extra)


def _installed(target: Path, wheel: Path, requirement: str, extra: tuple[str, ...]) -> Path:
    python, whole = target / "bin" / "python", target / ".installed"
    if whole.is_file():
        return python
    shutil.rmtree(target, ignore_errors=True)  # a venv an interrupted run left half installed
    target.parent.mkdir(parents=True, exist_ok=True)
    # a venv cannot be moved once made: built at its place, marked whole only at the end
    subprocess.run([sys.executable, "-m", "venv", str(target)], check=True)
    done = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", str(wheel), *extra],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        shutil.rmtree(target, ignore_errors=True)
        require(False, f"pip install {wheel.name} {' '.join(extra)}: {done.stderr[-500:]}")
    # its torch and NVIDIA wheels: one copy with the builds' venvs in the test cache's environment store
    # (tests/test_vision_build.py keeps its venvs there), as the store shares them between its own entries
    shared.share_identical(target, cache_dir() / "envs" / ".objects")
    whole.write_text(requirement + "\n")
    return python


# The CUDA toolkit the host-side CUDA tests compile with (tests/test_cache_cuda.py: nvcc; the host MAGMA build
# in tests/test_images.py: nvcc, cuBLAS, cuSPARSE). No GPU is needed: they only compile and link. From
# NVIDIA's PyPI wheels, laid out by scripts/install_cuda_toolkit.sh as the devel image lays them out, at the
# devel image's pins (images.spec.PYPI_TOOLKITS): CI has no other toolkit, so these tests run there too.
CUDA_TOOLKIT_EXTRAS = ("cccl", "crt", "cublas", "cudart", "culibos", "cusparse", "nvcc", "nvvm", "profiler")


def _has_toolkit(root: Path) -> bool:
    return (root / "bin" / "nvcc").is_file() and bool(list(root.glob("lib*/libcublas.so")))


def cuda_toolkit() -> Path:
    """A CUDA toolkit with nvcc, cuBLAS and cuSPARSE: ``$CUDA_HOME``, /usr/local/cuda or /usr/local/cuda-*
    when one has them, else CUDA 13.0 from NVIDIA's PyPI wheels (about 1.3 GB, made once and kept in the
    cache under ``cuda/``). Skips where no index answers (fails under CI=true)."""
    import glob

    from torchkiln.images.spec import PYPI_TOOLKITS

    candidates = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"))]
    for candidate in filter(None, candidates):
        if _has_toolkit(Path(candidate)):
            return Path(candidate)
    pypi = PYPI_TOOLKITS["13.0"]
    wheels = [f"cuda-toolkit[{','.join(CUDA_TOOLKIT_EXTRAS)}]=={pypi.meta}"]
    wheels += [pin for pin in pypi.pins if pin.startswith("nvidia-nvjitlink==")]  # cuBLAS's, pinned
    key = hashlib.sha256(" ".join(wheels).encode()).hexdigest()[:16]
    target = cache_dir() / "cuda" / f"13.0-{key}"
    with exclusive(target):
        return _toolkit_at(target, wheels)


def _toolkit_at(target: Path, wheels: list[str]) -> Path:
    if _has_toolkit(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        env = {
            "PATH": os.environ["PATH"],
            "HOME": os.environ.get("HOME", str(tmp)),
            "KILN_CUDA_FROM": "pypi",
            "KILN_CUDA": "13.0",
            "KILN_TOOLKIT_TARGET": "x86_64-linux",
            "KILN_CUDA_WHEELS": " ".join(wheels),
            "CUDA_PREFIX": str(tmp / "cuda"),
            "VIRTUAL_ENV": sys.prefix,
        }
        script = ROOT / "scripts" / "install_cuda_toolkit.sh"
        done = subprocess.run(
            ["bash", str(script)], env=env, capture_output=True, text=True, check=False, timeout=1800
        )
        require(done.returncode == 0, f"no CUDA toolkit from NVIDIA's PyPI wheels: {done.stderr[-800:]}")
        shutil.rmtree(target, ignore_errors=True)  # an incomplete one from an interrupted run
        os.replace(tmp / "cuda", target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
