"""A step's process environment, in layers: what is inherited, what torchkiln sets, and the secrets.

1. **base**: the caller's environment minus every variable that would steer PyTorch's or torchvision's build
   or the compiler cache (:data:`STEERING_PREFIXES`, :data:`STEERING_NAMES`), so a stray ``USE_CUDA=0`` or
   ``CCACHE_DISABLE`` in a shell cannot change a build;
2. **PATH prepend**: directories put in front of the inherited PATH (the build venv's ``bin/``);
3. **public layers**: the variables the plan shows (the step's own, then the compiler cache's);
4. **secret layer**: variables whose values are secrets (remote-cache credentials), added at run time
   only. They are never part of a plan, a log or a manifest, and never replace a masked value: a variable
   is either public or secret.

:func:`compose` is the one place these meet.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

# PyTorch's build forwards every BUILD_*, USE_*, CMAKE_* variable to CMake (tools/setup_helpers/cmake.py,
# cmake/EnvVarForwarding.cmake), plus the passthrough names below; CCACHE_*/SCCACHE_* configure the
# compiler cache, which is the recipe's, not whatever the user's shell exported.
STEERING_PREFIXES = ("USE_", "BUILD_", "CMAKE_", "TORCH_", "PYTORCH_", "TORCHVISION_", "CCACHE_", "SCCACHE_")
STEERING_NAMES = frozenset(
    {
        "MAX_JOBS",
        "DEBUG",
        "REL_WITH_DEB_INFO",
        "BLAS",
        "WITH_BLAS",
        "MAGMA_HOME",
        "FORCE_CUDA",
        "FORCE_MPS",
        "CUDA_HOME",
        "CUDA_PATH",
        "CUDACXX",
        "CUDAHOSTCXX",
        "CUDNN_LIBRARY",
        "CUDNN_INCLUDE_DIR",
        "CUDNN_ROOT",
        "CUDNN_LIB_DIR",
        "NCCL_ROOT",
        "NCCL_ROOT_DIR",
        "NCCL_LIB_DIR",
        "NCCL_INCLUDE_DIR",
        "NVCC_FLAGS",
        "INSTALL_TEST",
        "MKL_THREADING",
        "ATEN_THREADING",
        "ONNX_NAMESPACE",
        "WERROR",
        "PYTHONPATH",
        "PIP_REQUIRE_VIRTUALENV",
        "VIRTUAL_ENV",
        "PYTHONHOME",
    }
)


# Credentials the caller's environment may hold for the compiler cache's server or for the user's own tools,
# which no build step needs: sccache's cloud back ends read the AWS and GitHub Actions variables themselves
# (sccache docs/S3.md, docs/GHA.md; its server gets them, torchkiln.cache), Google's client libraries
# GOOGLE_APPLICATION_CREDENTIALS, and SSH_AUTH_SOCK reaches the user's ssh agent, which signs with the user's
# keys for whoever asks. The build steps get none of them (torchkiln.build.sandbox), fetch steps keep them
# (git may fetch over ssh or through a cloud credential helper).
CREDENTIAL_PREFIXES = ("AWS_", "ACTIONS_")
CREDENTIAL_NAMES = frozenset(
    {"GOOGLE_APPLICATION_CREDENTIALS", "SSH_AUTH_SOCK", "GPG_AGENT_INFO", "KRB5CCNAME"}
)


def without_credentials(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without :data:`CREDENTIAL_NAMES` and the variables of :data:`CREDENTIAL_PREFIXES`."""
    return {
        k: v
        for k, v in environ.items()
        if k not in CREDENTIAL_NAMES and not k.startswith(CREDENTIAL_PREFIXES)
    }


def base_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment minus every variable that steers the build or the compiler cache."""
    environ = os.environ if environ is None else environ
    return {
        k: v for k, v in environ.items() if k not in STEERING_NAMES and not k.startswith(STEERING_PREFIXES)
    }


def compose(
    environ: Mapping[str, str],
    *layers: Mapping[str, str],
    path_prepend: Sequence[str] = (),
) -> dict[str, str]:
    """The process environment: :func:`base_environment` of ``environ``, ``path_prepend`` in front of its
    PATH, then each layer in order (later layers win)."""
    env = base_environment(environ)
    if path_prepend:
        env["PATH"] = os.pathsep.join([*path_prepend, env.get("PATH", os.defpath)])
    for layer in layers:
        env.update(layer)
    return env
