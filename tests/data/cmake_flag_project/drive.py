"""Build this tree as torch's setup.py (releases up to 2.13) builds torch: with torch's own
tools/build_pytorch_libs.py and tools/setup_helpers/, which the test copies in from a real PyTorch tree.
setup.py's build_deps calls build_pytorch(...) with rerun_cmake=False unless `--cmake` is given."""

from tools.build_pytorch_libs import build_pytorch
from tools.setup_helpers.cmake import CMake

build_pytorch(
    version=None,
    cmake_python_library=None,
    build_python=False,
    rerun_cmake=False,
    cmake_only=False,
    cmake=CMake(),
)
