#!/usr/bin/env bash
# Runtime image, step 1: the Python interpreter and its venv, the non-root user, nothing else: no
# compiler, no headers, no nvcc (the CUDA runtime base brings the CUDA libraries; install_wheels.sh adds
# cuDNN/NCCL at the recipe's pins as NVIDIA's wheels). Reads KILN_PYTHON.
set -euo pipefail

: "${KILN_PYTHON:?KILN_PYTHON must be set (a build arg, e.g. 3.11)}"
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends ca-certificates \
  "python${KILN_PYTHON}" "python${KILN_PYTHON}-venv"
apt-get clean  # also drops pkgcache.bin/srcpkgcache.bin (~100 MB that nothing at run time reads)
rm -rf /var/lib/apt/lists/*

"python${KILN_PYTHON}" -m venv "${VIRTUAL_ENV:-/opt/venv}"
useradd --create-home --uid 10001 --user-group --shell /bin/bash kiln
