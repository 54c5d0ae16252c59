"""A tiny torch C++ extension: three translation units, so a build has several objects to cache.

Built with torch.utils.cpp_extension (the code path torchvision's setup.py uses) by torchkiln's
compiler-cache tests and benchmarks: ``python -m build --wheel --no-isolation``.
"""

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    name="kiln_cache_ext",
    version="0.1.0",
    ext_modules=[
        CppExtension(
            "kiln_cache_ext._C",
            ["csrc/module.cpp", "csrc/scale.cpp", "csrc/clamp.cpp"],
        )
    ],
    packages=["kiln_cache_ext"],
    cmdclass={"build_ext": BuildExtension},
)
