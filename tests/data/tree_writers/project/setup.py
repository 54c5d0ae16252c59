"""The tree-writer stand-in (tests/test_tree_writers.py), built the way torch builds itself: setup.py runs CMake
(Ninja generator) in the in-tree build/ with a C compiler the tree names (tools/kiln-cc). setup.py itself is the
first writer (tools/kiln_write.py); its build dependency (kiln-writer-dep) brings two more."""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "tools"))
import kiln_write  # noqa: E402

kiln_write.write("setup.py")


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        target = Path(self.get_ext_fullpath(ext.name)).resolve()
        build = HERE / "build" / "cmake"
        configure = ["cmake", "-S", str(HERE), "-B", str(build), "-G", "Ninja"]
        configure += [f"-DCMAKE_C_COMPILER={HERE / 'tools' / 'kiln-cc'}"]
        configure += [f"-DKILN_SUFFIX={sysconfig.get_config_var('EXT_SUFFIX')}", f"-DKILN_OUTPUT_DIR={target.parent}"]
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", str(build)], check=True)


setup(
    version=os.environ.get("PYTORCH_BUILD_VERSION", "0.0.1"),
    ext_modules=[Extension("kiln_writers._C", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)
