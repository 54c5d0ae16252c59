"""A tiny torch C++ extension: three translation units, so a build has several objects to cache.

Built with torch.utils.cpp_extension (the code path torchvision's setup.py uses) by torchkiln's
compiler-cache tests and benchmarks: ``python -m build --wheel --no-isolation``. With
KILN_CACHE_EXT_CUDA=1 it is a CUDAExtension with a fourth, CUDA, translation unit (needs a CUDA torch and
nvcc; the CUDA devel image test builds it so). With KILN_CACHE_EXT_BINDINGS_ONLY=1 module.cpp includes torch's
pybind11 header alone instead of <torch/extension.h> (the arm64 image check, where cc1plus runs under qemu).
"""

import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

CUDA = os.environ.get("KILN_CACHE_EXT_CUDA") == "1"
sources = ["csrc/module.cpp", "csrc/scale.cpp", "csrc/clamp.cpp"]
Extension = CUDAExtension if CUDA else CppExtension
macros = [("KILN_WITH_CUDA", None)] if CUDA else []
if os.environ.get("KILN_CACHE_EXT_BINDINGS_ONLY") == "1":
    macros.append(("KILN_BINDINGS_ONLY", None))

setup(
    name="kiln_cache_ext",
    version="0.1.0",
    ext_modules=[
        Extension(
            "kiln_cache_ext._C",
            sources + (["csrc/fill_cuda.cu"] if CUDA else []),
            define_macros=macros,
        )
    ],
    packages=["kiln_cache_ext"],
    cmdclass={"build_ext": BuildExtension},
)
