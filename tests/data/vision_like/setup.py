"""A source tree with the properties of a real torchvision checkout that matter to a cached rebuild.

Like torchvision's setup.py: the version comes from version.txt (BUILD_VERSION overrides it) and is written
into the package (kiln_vision_like/version.py, with the git sha or "Unknown") on every build; the two
extensions (_C: 31 translation units, image: 13) are compiled with torch.utils.cpp_extension against the
torch of the build env, whose headers live in the build venv, with ninja, in an in-tree build/ directory.
It is not a git checkout when copied. 44 translation units, each including ATen headers: a few seconds of
compile each, so a cold build is minutes and a cached rebuild is what the cache costs. 42 of them include
csrc/kiln_macros.h (as torchvision's units include csrc/macros.h), and DEBUG=1 compiles with -g -O0 as
torchvision's setup.py does (else -g0).
"""

import os
import subprocess
from pathlib import Path

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = Path(__file__).resolve().parent


def version() -> tuple[str, str]:
    sha = "Unknown"
    try:
        sha = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=ROOT, stderr=subprocess.DEVNULL).decode().strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return os.environ.get("BUILD_VERSION") or (ROOT / "version.txt").read_text().strip(), sha


def write_version_file(text: str, sha: str) -> None:
    (ROOT / "kiln_vision_like" / "version.py").write_text(f"__version__ = {text!r}\ngit_version = {sha!r}\n")


def sources(pattern: str) -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in ROOT.glob(pattern))


DEBUG = os.getenv("DEBUG", "0") == "1"  # torchvision's setup.py reads it the same way
FLAGS = ["-g", "-O0"] if DEBUG else ["-g0"]
VERSION, SHA = version()
write_version_file(VERSION, SHA)
pytorch_dep = "torch" + (f"=={os.environ['PYTORCH_VERSION']}" if os.environ.get("PYTORCH_VERSION") else "")

setup(
    name="kiln_vision_like",
    version=VERSION,
    packages=find_packages(include=["kiln_vision_like"]),
    install_requires=[pytorch_dep],
    ext_modules=[
        CppExtension(
            "kiln_vision_like._C", ["csrc/vision.cpp", *sources("csrc/ops/*.cpp")], extra_compile_args=FLAGS
        ),
        CppExtension("kiln_vision_like.image", sources("csrc/io/*.cpp"), extra_compile_args=FLAGS),
    ],
    cmdclass={"build_ext": BuildExtension.with_options(no_python_abi_suffix=True)},
)
