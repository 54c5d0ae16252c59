"""Preflight: a build that cannot succeed is refused before the first byte is fetched, with every reason at once.

``torchkiln check RECIPE`` runs it, and so do ``build`` (before its first step). The recipe itself has been
checked completely by then (:mod:`torchkiln.recipe.loader`: every field, every rule, in one pass); this module checks
the **host** against the resolved plan, every check run, every problem collected:

======== ==========================================================================================
python   ``pythonX.Y`` of the recipe runs (a pyenv shim that cannot is "not installed"), with venv/ensurepip
cxx, cc  the C++ and C compilers the build invokes (``$CXX`` else ``c++``, ``$CC`` else ``cc``) exist and
         compile and link a trivial program (standard headers included)
python-headers ``Python.h`` where the recipe's Python's ``sysconfig.get_path("include")`` says
compiler ``$CC`` (else ``gcc``): the recipe's ``build.gcc`` major, the torch release's minimum
         (data/host_tools.toml ``gcc_min``), the newest the recipe's nvcc accepts (``gcc_max``)
nvcc     ``$CUDA_HOME/bin/nvcc`` of the plan reports the recipe's CUDA version; a toolkit with a
         ``targets/`` directory has the platform's (``x86_64-linux``, ``sbsa-linux``)
cudnn    ``cudnn_version.h`` under ``$CUDA_HOME/include`` equals the recipe's pin (major.minor.patch)
nccl     ``nccl.h`` under ``$NCCL_INCLUDE_DIR`` equals the recipe's pin
magma    ``$MAGMA_HOME`` holds MAGMA's headers and library, at the recipe's version
platform this machine is the recipe's ``build.platform`` (``uname -m``): no cross-compiling
blas     OpenBLAS: its library and ``cblas.h`` on the system (MKL comes from pip, into the build venv); NVPL
         (aarch64): its lp64 OpenMP library and ``nvpl_blas.h`` where upstream installs it (/opt/nvpl)
git      new enough (``git_min``) when a source is fetched
cache    the compiler cache's tool (ccache, sccache) is on PATH, unless the cache is ``none``
disk     free space under the work directory: :data:`~torchkiln.plan.preflight_machine.DISK_GIB` (estimates;
         see there), ``DISK_GIB_VISION`` for torchvision alone
memory   enough for the compile jobs asked for: :data:`torchkiln.plan.jobs.PER_JOB_GIB` per job + reserve
source   a ``--source-dir`` tree's ``version.txt`` is the recipe's release
         (:func:`~torchkiln.plan.source_adoption.source_versions`)
torch-wheel ``--only torchvision`` without ``--torch``: the recipe's torch wheel is in dist/ (or the wheelhouse)
submods  a ``--source-dir`` tree carries the submodules it declares (:mod:`torchkiln.source.submodules`;
         a fetched checkout is checked right after its fetch steps)
vision   each part of ``[torchvision.features]`` asked for is where torchvision's setup.py will look for it
         (:mod:`torchkiln.plan.vision_parts`: libpng-config, jpeglib.h, webp/decode.h, nvjpeg.h, FFmpeg);
         the directories of ``torchvision.include_dirs`` / ``library_dirs`` exist
======== ==========================================================================================

:data:`CHECKS` runs them in order; each lives in the module of its subject: ``preflight_python`` (python,
python-headers), ``preflight_toolchain`` (cxx, cc, compiler, cache), ``preflight_libraries`` (nvcc, cudnn,
nccl, magma, blas, vision), ``preflight_machine`` (platform, disk, memory), ``preflight_sources`` (git,
source, submods, torch-wheel); what every check reads and yields is ``preflight_findings``.

cmake and ninja are not checked on the host: the build venv gets them from pip (``cmake>=3.27``, ``ninja``;
the CMake range of the release in data/host_tools.toml: ``cmake>=3.18,<4`` for 2.6) and its ``bin/`` comes first on the compile steps' PATH.

Each problem names what was found, what the recipe wants and the fix
(:class:`~torchkiln.plan.preflight_findings.Finding`), the fix as this host's distribution has it
(/etc/os-release: :mod:`torchkiln.host.distro`, whose table says what each known release packages; another
distribution gets no apt-get it may not have).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .model import Plan
from .preflight_findings import Finding, Host, HostCheck, PreflightError
from .preflight_libraries import _blas, _cudnn, _magma, _nccl, _nvcc, _vision_parts
from .preflight_machine import _disk, _memory, _platform
from .preflight_python import _python, _python_headers
from .preflight_sources import _git, _sources, _submodules, _torch_wheel
from .preflight_toolchain import _cache_tool, _compiler, _toolchain

CHECKS: tuple[tuple[str, HostCheck], ...] = (
    ("platform", _platform),
    ("python", _python),
    ("toolchain", _toolchain),
    ("python-headers", _python_headers),
    ("compiler", _compiler),
    ("cache", _cache_tool),
    ("nvcc", _nvcc),
    ("cudnn", _cudnn),
    ("nccl", _nccl),
    ("magma", _magma),
    ("blas", _blas),
    ("git", _git),
    ("disk", _disk),
    ("memory", _memory),
    ("source", _sources),
    ("submodules", _submodules),
    ("torch-wheel", _torch_wheel),
    ("vision-parts", _vision_parts),
)


def preflight(plan: Plan, environ: Mapping[str, str] | None = None) -> list[Finding]:
    """Every host problem of ``plan``: every check runs, whatever the others found."""
    host = Host(dict(os.environ if environ is None else environ))
    findings: list[Finding] = []
    for _, check in CHECKS:
        findings += check(plan, host)
    return findings


def require(plan: Plan, environ: Mapping[str, str] | None = None) -> None:
    """Raise :class:`PreflightError` with every problem when the host cannot build ``plan``. (An adopted
    tree's version was rule-checked before the plan was made:
    :func:`~torchkiln.plan.source_adoption.adopted_rule_problems`.)"""
    findings = preflight(plan, environ)
    if findings:
        raise PreflightError(findings)
