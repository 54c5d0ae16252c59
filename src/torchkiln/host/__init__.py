"""What this machine has: the tools a build runs, at the versions they report.

:mod:`.toolchain` probes compilers, CMake, ninja, nvcc, git and the cuDNN header (one table of probes,
:data:`.toolchain.PROBES`); the preflight compares them with a plan, the manifest records them.
:mod:`.loader` reads the dynamic loader's cache and default directories (the SBOM, verify's linkage check).
:mod:`.cgroup` reads this process's own cgroup (v2 or v1): the memory and CPU limits that size ``MAX_JOBS``,
the kernel's count of OOM kills there, the peak.

May import: :mod:`torchkiln.process`, :mod:`torchkiln.errors`.
"""
