#!/usr/bin/env bash
# Devel image, last step: prove the toolchain is the one the recipe asked for (the post-build self-check
# of PyTorch's .ci/docker images). Fails the image build on the first mismatch, naming it.
set -euo pipefail

fail() { echo "devel self-check: $*" >&2; exit 1; }
check_tool() { command -v "$1" >/dev/null || fail "$1 is not on PATH"; }

for tool in gcc g++ cmake ninja ccache git patchelf python torchkiln; do check_tool "$tool"; done

py=$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[[ "$py" == "${PYTHON_VERSION}" ]] || fail "python is $py, the recipe asks for ${PYTHON_VERSION}"
gcc_major=$(gcc -dumpversion | cut -d. -f1)
if [[ -n "${GCC_VERSION:-}" ]]; then
  [[ "$gcc_major" == "${GCC_VERSION}" ]] || fail "gcc is $gcc_major, the recipe asks for ${GCC_VERSION}"
fi
if [[ -n "${CUDA_VERSION:-}" ]]; then
  check_tool nvcc
  nvcc_version=$(nvcc --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
  [[ "$nvcc_version" == "${CUDA_VERSION}" ]] || fail "nvcc is CUDA $nvcc_version, the recipe asks for ${CUDA_VERSION}"
  test -f /usr/local/cuda/include/cudnn_version.h || fail "cuDNN headers missing from /usr/local/cuda/include"
  test -f /usr/local/cuda/include/nccl.h || fail "NCCL headers missing from /usr/local/cuda/include"
fi
if [[ -n "${MKL_VERSION:-}" ]]; then
  test -f "${MKLROOT}/include/mkl.h" || fail "MKL headers missing from ${MKLROOT}/include"
fi
if [[ -n "${MAGMA_VERSION:-}" ]]; then
  test -f "${MAGMA_PREFIX:-/usr/local/magma}/include/magma.h" || fail "MAGMA headers missing"
fi
torchkiln --version >/dev/null

echo "devel self-check: python $py, gcc $gcc_major, cmake $(cmake --version | head -1 | awk '{print $3}')," \
  "ninja $(ninja --version), ccache $(ccache --version | head -1 | awk '{print $3}')," \
  "CUDA ${CUDA_VERSION:-none}, MKL ${MKL_VERSION:-none}, MAGMA ${MAGMA_VERSION:-none}"
