"""One C extension module. -g0 after Python's own -g: no debug information, which would hold the build's
directory (DW_AT_comp_dir) and so differ between work directories."""

import os

from setuptools import Extension, setup

setup(
    version=os.environ.get("PYTORCH_BUILD_VERSION", "0.0.1"),
    ext_modules=[Extension("kiln_repro._speed", ["csrc/speed.c"], extra_compile_args=["-O1", "-g0"])],
)
