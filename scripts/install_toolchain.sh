#!/usr/bin/env bash
# Devel image, step 1: compilers, build tools and the Python venv, from the distribution's packages.
# Reads the build args PYTHON_VERSION and GCC_VERSION (empty: the distribution's default gcc).
set -euo pipefail

: "${PYTHON_VERSION:?PYTHON_VERSION must be set (a build arg, e.g. 3.11)}"
export DEBIAN_FRONTEND=noninteractive

compilers=(gcc g++)
if [[ -n "${GCC_VERSION:-}" ]]; then
  compilers=("gcc-${GCC_VERSION}" "g++-${GCC_VERSION}")
fi

apt-get update
apt-get install -y --no-install-recommends \
  "${compilers[@]}" make cmake ninja-build ccache git patchelf \
  ca-certificates curl xz-utils bzip2 \
  "python${PYTHON_VERSION}" "python${PYTHON_VERSION}-venv" "python${PYTHON_VERSION}-dev"
apt-get clean  # also drops pkgcache.bin/srcpkgcache.bin (~100 MB that nothing at run time reads)
rm -rf /var/lib/apt/lists/*

if [[ -n "${GCC_VERSION:-}" ]]; then
  # Make the pinned gcc the one `gcc`/`cc` name, so CMake and setuptools cannot pick another.
  update-alternatives --install /usr/bin/gcc gcc "/usr/bin/gcc-${GCC_VERSION}" 100 \
    --slave /usr/bin/g++ g++ "/usr/bin/g++-${GCC_VERSION}"
  update-alternatives --install /usr/bin/cc cc "/usr/bin/gcc-${GCC_VERSION}" 100
  update-alternatives --install /usr/bin/c++ c++ "/usr/bin/g++-${GCC_VERSION}" 100
fi

"python${PYTHON_VERSION}" -m venv "${VIRTUAL_ENV:-/opt/venv}"
