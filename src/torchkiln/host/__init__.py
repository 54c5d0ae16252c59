"""What this machine has: the tools a build runs, at the versions they report.

:mod:`.toolchain` probes compilers, CMake, ninja, nvcc, git and the cuDNN header (one table of probes,
:data:`.toolchain.PROBES`); the preflight compares them with a plan, the manifest records them.
:mod:`.loader` reads the dynamic loader's cache and default directories (the SBOM, verify's linkage check).

May import: :mod:`torchkiln.process`, :mod:`torchkiln.errors`.
"""
