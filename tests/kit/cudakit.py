"""CUDA 12.4.1, the toolkit upstream's torch 2.6.0+cu124 was built with, for compiling torchvision 0.21's CUDA
parts in the tests (nothing of it runs on a GPU).

NVIDIA's CUDA 12 wheels on the package index carry no compiler driver: nvidia-cuda-nvcc-cu12 12.4.131 (and
every release up to 12.9.86, read with ``unzip -l``) ships ``bin/ptxas``, ``nvvm/`` and the ``crt`` headers
only. So the driver and the tools it runs (nvcc, cicc, fatbinary, nvlink, cudafe++, bin2c, crt/*.stub) come
from Debian's ``nvidia-cuda-toolkit 12.4.131~12.4.1-2`` (trixie, non-free: NVIDIA's own binaries of CUDA
12.4.1, repackaged), checked against the sha256 of Debian's Packages index; everything else (headers,
libraries, libdevice, libnvvm; cuBLAS, cuSPARSE, cuSOLVER, cuRAND headers that ATen's CUDA headers include;
nvJPEG for torchvision's GPU codec) from NVIDIA's wheels of the same release, laid out by
scripts/install_cuda_toolkit.sh as the devel image lays out a toolkit. ``bin/nvcc.profile`` is NVIDIA's
(the CUDA 12 installer's, as the CUDA 13 wheel ships it less ``CICC_PATH``/``cccl``).

The toolkit is kept in the test cache (``cuda-12.4.1/``, complete or absent). Skips where Debian's archive or
the package index cannot be reached; fails under ``CI=true``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from kit import ROOT, realtrees
from kit.cachelock import exclusive
from kit.imagekit import need_sandbox, require

CUDA = "12.4"

NVCC_DEB = realtrees.Tarball(
    "pool/non-free/n/nvidia-cuda-toolkit/nvidia-cuda-toolkit_12.4.131~12.4.1-2_amd64.deb",
    "cd5fe85aee38d108b315f408a688641478f2402622a10c677478eb7a6c4e5319",
    "",
)
# From the .deb (its path -> the toolkit's): Debian's /usr/bin/nvcc is a shell wrapper, the driver itself
# lives in /usr/lib/nvidia-cuda-toolkit/bin with cicc and the link stubs.
FROM_DEB = {
    "usr/lib/nvidia-cuda-toolkit/bin/nvcc": "bin/nvcc",
    "usr/lib/nvidia-cuda-toolkit/bin/crt/link.stub": "bin/crt/link.stub",
    "usr/lib/nvidia-cuda-toolkit/bin/crt/prelink.stub": "bin/crt/prelink.stub",
    "usr/lib/nvidia-cuda-toolkit/bin/cicc": "nvvm/bin/cicc",
    "usr/bin/fatbinary": "bin/fatbinary",
    "usr/bin/nvlink": "bin/nvlink",
    "usr/bin/cudafe++": "bin/cudafe++",
    "usr/bin/bin2c": "bin/bin2c",
}
# cuda-toolkit 12.4.1's extras pin each component (nvcc 12.4.131, cudart 12.4.127, cuBLAS 12.4.5.8, nvJPEG
# 12.3.1.117, ...: the versions torch 2.6.0+cu124's METADATA requires); nvjitlink, which cuSPARSE pulls in
# unpinned, is held to the release's own.
WHEELS = (
    "cuda-toolkit[cccl,cublas,cudart,curand,cusolver,cusparse,nvcc,nvjpeg,nvtx,profiler]==12.4.1",
    "nvidia-nvjitlink-cu12==12.4.127",
)
NVCC_PROFILE = """
TOP              = $(_HERE_)/..

NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice

LD_LIBRARY_PATH += $(TOP)/lib:
PATH            += $(TOP)/nvvm/bin:$(_HERE_):

INCLUDES        +=  "-I$(TOP)/$(_TARGET_DIR_)/include" $(_SPACE_)

LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/$(_TARGET_DIR_)/lib$(_TARGET_SIZE_)/stubs" "-L$(TOP)/$(_TARGET_DIR_)/lib$(_TARGET_SIZE_)"

CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
"""


def _compiler_part(prefix: Path) -> None:
    """nvcc and its tools from Debian's package, and NVIDIA's nvcc.profile, into ``prefix``."""
    deb = realtrees.fetch(NVCC_DEB)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg-deb", "-x", str(deb), tmp], check=True)
        for source, target in FROM_DEB.items():
            (prefix / target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(tmp) / source, prefix / target)
    (prefix / "bin" / "nvcc.profile").write_text(NVCC_PROFILE)


def toolkit() -> Path:
    """The CUDA 12.4.1 toolkit directory (a CUDA_HOME), made once and kept in the test cache."""
    target = realtrees.cache_dir() / "cuda-12.4.1"
    with exclusive(target):
        return _made_toolkit(target)


def _made_toolkit(target: Path) -> Path:
    if (target / "bin" / "nvcc").is_file():
        return target
    require(shutil.which("dpkg-deb") is not None, "dpkg-deb is not installed (Debian's dpkg)")
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=target.parent, prefix=".cuda-12.4.1."))
    try:
        _compiler_part(work)
        env = {
            **os.environ,
            "VIRTUAL_ENV": sys.prefix,  # the script runs $VIRTUAL_ENV/bin/python -m pip
            "KILN_CUDA_FROM": "pypi",
            "KILN_CUDA": CUDA,
            "KILN_TOOLKIT_TARGET": "x86_64-linux",
            "KILN_CUDA_WHEELS": " ".join(WHEELS),
            "CUDA_PREFIX": str(work),
        }
        done = subprocess.run(
            ["bash", str(ROOT / "scripts" / "install_cuda_toolkit.sh")],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        require(done.returncode == 0, f"install_cuda_toolkit.sh (CUDA {CUDA}): {done.stderr[-1500:]}")
        os.replace(work, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


# The plan's CUDA_HOME for the toolkit (torchkiln.plan.environment: /usr/local/cuda-X.Y)
CUDA_HOME = Path(f"/usr/local/cuda-{CUDA}")


def sandbox(toolkit: Path, *, hide_libpng: bool = False) -> list[str]:
    """bubblewrap: the host as it is, with /usr/local a fresh tmpfs holding the host's own entries and the
    toolkit at /usr/local/cuda-12.4; with ``hide_libpng``, libpng-config not executable and no png.h."""
    # --unshare-pid, --die-with-parent: nothing of the build outlives the test (a timeout kills it all)
    argv = [need_sandbox(), "--unshare-pid", "--die-with-parent", "--bind", "/", "/", "--dev", "/dev"]
    argv += ["--proc", "/proc", "--tmpfs", "/usr/local"]
    for entry in sorted(Path("/usr/local").iterdir()):
        if entry == CUDA_HOME:
            continue
        if entry.is_symlink():
            argv += ["--symlink", os.readlink(entry), str(entry)]
        else:
            argv += ["--bind", str(entry), str(entry)]
    argv += ["--ro-bind", str(toolkit), str(CUDA_HOME)]
    if hide_libpng:
        config = shutil.which("libpng-config")
        require(config is not None, "libpng-dev is not installed (CI installs it)")
        argv += ["--ro-bind", "/dev/null", str(Path(config).resolve())]  # libpng16-config: not executable
        argv += ["--tmpfs", "/usr/include/libpng16"]  # png.h (and /usr/include/png.h, its link) gone
    return argv
