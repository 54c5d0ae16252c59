"""Build the extension with torch.utils.cpp_extension (ninja when available, as torch's own build)."""

import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    version=os.environ.get("PYTORCH_BUILD_VERSION", "0.0.1"),
    ext_modules=[
        CppExtension(
            "kiln_ext._C",
            ["csrc/ops.cpp", "csrc/bind.cpp"],
            extra_compile_args=["-O1", "-g0"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
