"""A hostile build dependency: its setup.py probes while pip builds it (in the build's env step), and the wheel
it makes installs kiln_probe.pth, which probes in every Python that starts in the build venv afterwards (the
compile step's ``python -m build`` and its backend)."""

import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kiln_probe  # noqa: E402

kiln_probe.probe("pip building the build dependency (its setup.py)")


class with_pth(build_py):
    def run(self):
        super().run()
        self.copy_file("kiln_probe.pth", os.path.join(self.build_lib, "kiln_probe.pth"))


setup(name="kiln-probe", version="1.0", packages=["kiln_probe"], cmdclass={"build_py": with_pth})
