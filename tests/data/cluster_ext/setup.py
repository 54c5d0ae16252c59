"""tests/data/cache_ext plus one CUDA translation unit: what the distributed-compile tests and bench build.

The C++ sources are cache_ext's (the tests copy tests/data/cache_ext and lay this directory over it), so a
build has both kinds of compile sccache-dist distributes: g++ for the C++ files, and for csrc/kernel.cu the
steps nvcc runs (cudafe++, cicc, ptxas and the host g++ compile). Only nvcc and the CUDA runtime library are
needed: torch may be the CPU wheel (CppExtension, not CUDAExtension, which would link libtorch_cuda), and no
GPU is used, so the arch list is fixed instead of detected.
"""

import os

import torch.utils.cpp_extension as cpp_extension
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

# The CPU wheel of torch sets cpp_extension.CUDA_HOME to None whatever is installed; nvcc is found here.
CUDA_HOME = cpp_extension.CUDA_HOME or os.environ.get("CUDA_HOME") or "/usr/local/cuda"
if not os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc")):
    raise SystemExit(f"cluster_ext: no nvcc in {CUDA_HOME}/bin (set CUDA_HOME to the CUDA toolkit)")
cpp_extension.CUDA_HOME = CUDA_HOME
os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "7.5")

setup(
    name="kiln_cache_ext",
    version="0.1.0",
    ext_modules=[
        CppExtension(
            "kiln_cache_ext._C",
            ["csrc/module.cpp", "csrc/scale.cpp", "csrc/clamp.cpp", "csrc/kernel.cu"],
            library_dirs=[os.path.join(CUDA_HOME, "lib64")],
            libraries=["cudart"],
        )
    ],
    packages=["kiln_cache_ext"],
    cmdclass={"build_ext": BuildExtension},
)
