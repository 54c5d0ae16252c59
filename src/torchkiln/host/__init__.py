"""What this machine has: the tools a build runs, at the versions they report.

:mod:`.toolchain` probes compilers, CMake, ninja, nvcc, git and the cuDNN header (one table of probes,
:data:`.toolchain.PROBES`); the preflight compares them with a plan, the manifest records them.

May import: :mod:`torchkiln.process`, :mod:`torchkiln.errors`.
"""
