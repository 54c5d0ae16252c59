"""Writes the build time (to the microsecond) into build/lib/kiln_unrepro/build_time.txt, a file of the wheel,
and into the extension module (a string in .rodata): what a real project's "built on ..." stamp does."""

import datetime
import os
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

BUILT_AT = datetime.datetime.now(datetime.UTC).isoformat()


class StampedBuildPy(build_py):
    def run(self) -> None:
        super().run()
        stamp = Path(self.build_lib) / "kiln_unrepro" / "build_time.txt"
        stamp.write_text(f"built at {BUILT_AT}\n")


setup(
    version=os.environ.get("PYTORCH_BUILD_VERSION", "0.0.1"),
    ext_modules=[
        Extension(
            "kiln_unrepro._stamp",
            ["csrc/stamp.c"],
            define_macros=[("KILN_BUILT_AT", f'"{BUILT_AT}"')],
            extra_compile_args=["-O1", "-g0"],
        )
    ],
    cmdclass={"build_py": StampedBuildPy},
)
