"""One C extension module, built the same wherever and whenever it is built: -g0 after Python's own -g (no
debug information, which would hold the build's directory, DW_AT_comp_dir).

The non-reproducible control is this tree with a file named STAMP_BUILD_TIME in it: then setup.py writes the
build time (to the microsecond) into kiln_repro/build_time.txt, a file of the wheel, and compiles it into
the extension (a string in .rodata), as a real project's "built on ..." stamp does. One setup.py for both,
so both builds share one build venv (its key holds setup.py's bytes)."""

import datetime
import os
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
STAMPED = (HERE / "STAMP_BUILD_TIME").exists()
BUILT_AT = datetime.datetime.now(datetime.timezone.utc).isoformat()


class StampedBuildPy(build_py):
    def run(self) -> None:
        super().run()
        if STAMPED:
            (Path(self.build_lib) / "kiln_repro" / "build_time.txt").write_text(f"built at {BUILT_AT}\n")


setup(
    version=os.environ.get("PYTORCH_BUILD_VERSION", "0.0.1"),
    ext_modules=[
        Extension(
            "kiln_repro._speed",
            ["csrc/speed.c"],
            define_macros=[("KILN_BUILT_AT", f'"{BUILT_AT}"')] if STAMPED else [],
            extra_compile_args=["-O1", "-g0"],
        )
    ],
    cmdclass={"build_py": StampedBuildPy},
)
