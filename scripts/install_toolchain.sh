#!/usr/bin/env bash
# Devel image, step 1: compilers, build tools and the Python venv, from the distribution's packages.
# Reads the build args KILN_PYTHON, KILN_GCC (empty: the distribution's default gcc) and
# KILN_VISION_PACKAGES (the -dev packages of torchvision's optional parts the recipe builds, from
# torchkiln's table: libpng-dev, libjpeg-dev, libwebp-dev).
set -euo pipefail

: "${KILN_PYTHON:?KILN_PYTHON must be set (a build arg, e.g. 3.11)}"
export DEBIAN_FRONTEND=noninteractive

compilers=(gcc g++)
if [[ -n "${KILN_GCC:-}" ]]; then
  compilers=("gcc-${KILN_GCC}" "g++-${KILN_GCC}")
fi

read -r -a vision_packages <<< "${KILN_VISION_PACKAGES:-}"

apt-get update
apt-get install -y --no-install-recommends \
  "${compilers[@]}" make cmake ninja-build ccache git patchelf \
  ca-certificates curl xz-utils bzip2 \
  "python${KILN_PYTHON}" "python${KILN_PYTHON}-venv" "python${KILN_PYTHON}-dev" \
  "${vision_packages[@]}"
apt-get clean  # also drops pkgcache.bin/srcpkgcache.bin (~100 MB that nothing at run time reads)
rm -rf /var/lib/apt/lists/*

if [[ -n "${KILN_GCC:-}" ]]; then
  # Make the pinned gcc the one `gcc`/`cc` name, so CMake and setuptools cannot pick another. Debian's and
  # Ubuntu's Python compile extensions with the triplet names (sysconfig CC/CXX: x86_64-linux-gnu-g++),
  # which only the unversioned gcc/g++ packages provide: point them at the pinned gcc too.
  triplet=$("gcc-${KILN_GCC}" -dumpmachine)
  update-alternatives --install /usr/bin/gcc gcc "/usr/bin/gcc-${KILN_GCC}" 100 \
    --slave /usr/bin/g++ g++ "/usr/bin/g++-${KILN_GCC}"
  update-alternatives --install /usr/bin/cc cc "/usr/bin/gcc-${KILN_GCC}" 100
  update-alternatives --install /usr/bin/c++ c++ "/usr/bin/g++-${KILN_GCC}" 100
  update-alternatives --install "/usr/bin/${triplet}-gcc" "${triplet}-gcc" "/usr/bin/${triplet}-gcc-${KILN_GCC}" 100 \
    --slave "/usr/bin/${triplet}-g++" "${triplet}-g++" "/usr/bin/${triplet}-g++-${KILN_GCC}"
fi

"python${KILN_PYTHON}" -m venv "${VIRTUAL_ENV:-/opt/venv}"
