"""A torch-shaped stand-in (tests/test_deploy.py): a CUDA library in torchlike/lib that links libcudart and
libcublas, as torch's torch/lib/libtorch_cuda.so does, and a Python extension torchlike/_C that links it, as
torch/_C does. Linked as torch's CMake links (CMAKE_INSTALL_RPATH_USE_LINK_PATH): the library's RUNPATH is
$ORIGIN and the toolkit's lib64 ($CUDA_HOME/lib64, the build host's), _C's $ORIGIN/lib. Its requirements are
PYTORCH_EXTRA_INSTALL_REQUIREMENTS split at '|', as torch's setup.py does (release 2.6.0's, line 978)."""

import os
import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

CUDA_HOME = os.environ["CUDA_HOME"]
HERE = Path(__file__).resolve().parent


class BuildWithCudaLibrary(build_ext):
    """libtorchlike_cuda.so first, into the package's lib/, then _C against it."""

    def run(self) -> None:
        lib = Path(self.build_lib).resolve() / "torchlike" / "lib"
        lib.mkdir(parents=True, exist_ok=True)
        argv = ["cc", "-shared", "-fPIC", "-O1", "-o", str(lib / "libtorchlike_cuda.so")]
        argv += [str(HERE / "csrc" / "cuda.c"), f"-I{CUDA_HOME}/include", f"-L{CUDA_HOME}/lib64"]
        argv += ["-lcudart", "-lcublas", "-Wl,-soname,libtorchlike_cuda.so", "-Wl,--enable-new-dtags"]
        argv += [f"-Wl,-rpath,$ORIGIN:{CUDA_HOME}/lib64"]
        subprocess.run(argv, check=True)
        for ext in self.extensions:
            ext.library_dirs.append(str(lib))
        super().run()


requirements = os.environ.get("PYTORCH_EXTRA_INSTALL_REQUIREMENTS", "")
setup(
    name="torchlike",
    version="1.0",
    packages=["torchlike"],
    ext_modules=[
        Extension(
            "torchlike._C",
            [str(Path("csrc") / "module.c")],
            libraries=["torchlike_cuda"],
            runtime_library_dirs=["$ORIGIN/lib"],
        )
    ],
    cmdclass={"build_ext": BuildWithCudaLibrary},
    install_requires=[r.strip() for r in requirements.split("|") if r.strip()],
)
