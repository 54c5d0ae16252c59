"""Built the way torch builds itself: setup.py runs CMake (Ninja generator) in the in-tree build/ and then
``cmake --build`` with MAX_JOBS jobs, as torch's tools/setup_helpers/cmake.py does. Like torch's libtorch_cpu
and torch_python, the core library's units see no Python include directory and the module's does."""

import os
import subprocess
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        target = Path(self.get_ext_fullpath(ext.name)).resolve()
        build = HERE / "build" / "cmake"
        configure = [
            "cmake",
            "-S",
            str(HERE),
            "-B",
            str(build),
            "-G",
            "Ninja",
            f"-DKILN_PYTHON_INCLUDE={sysconfig.get_path('include')}",
            f"-DKILN_SUFFIX={sysconfig.get_config_var('EXT_SUFFIX')}",
            f"-DKILN_OUTPUT_DIR={target.parent}",
        ]
        subprocess.run(configure, check=True)
        jobs = os.environ.get("MAX_JOBS") or str(os.cpu_count())
        subprocess.run(["cmake", "--build", str(build), "--parallel", jobs], check=True)


setup(
    version=os.environ.get("PYTORCH_BUILD_VERSION", "0.0.1"),
    ext_modules=[Extension("kiln_pythons._C", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)
