#!/usr/bin/env bash
# Devel image, last step: prove the toolchain is the one the recipe asked for (the post-build self-check
# of PyTorch's .ci/docker images). Fails the image build on the first mismatch, naming it.
set -euo pipefail

fail() { echo "devel self-check: $*" >&2; exit 1; }
check_tool() { command -v "$1" >/dev/null || fail "$1 is not on PATH"; }

for tool in gcc g++ cmake ninja ccache git patchelf python torchkiln; do check_tool "$tool"; done

py=$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[[ "$py" == "${KILN_PYTHON}" ]] || fail "python is $py, the recipe asks for ${KILN_PYTHON}"
gcc_major=$(gcc -dumpversion | cut -d. -f1)
if [[ -n "${KILN_GCC:-}" ]]; then
  [[ "$gcc_major" == "${KILN_GCC}" ]] || fail "gcc is $gcc_major, the recipe asks for ${KILN_GCC}"
fi
if [[ -n "${KILN_CUDA:-}" ]]; then
  check_tool nvcc
  nvcc_version=$(nvcc --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
  [[ "$nvcc_version" == "${KILN_CUDA}" ]] || fail "nvcc is CUDA $nvcc_version, the recipe asks for ${KILN_CUDA}"
  test -f /usr/local/cuda/include/cudnn_version.h || fail "cuDNN headers missing from /usr/local/cuda/include"
  test -f /usr/local/cuda/include/nccl.h || fail "NCCL headers missing from /usr/local/cuda/include"
fi
if [[ -n "${KILN_MKL:-}" ]]; then
  test -f "${MKLROOT}/include/mkl.h" || fail "MKL headers missing from ${MKLROOT}/include"
fi
if [[ -n "${KILN_MAGMA_VERSION:-}" ]]; then
  test -f "${MAGMA_PREFIX:-/usr/local/magma}/include/magma.h" || fail "MAGMA headers missing"
fi
torchkiln --version >/dev/null

echo "devel self-check: python $py, gcc $gcc_major, cmake $(cmake --version | head -1 | awk '{print $3}')," \
  "ninja $(ninja --version), ccache $(ccache --version | head -1 | awk '{print $3}')," \
  "CUDA ${KILN_CUDA:-none}, MKL ${KILN_MKL:-none}, MAGMA ${KILN_MAGMA_VERSION:-none}"
