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
# The compilers Python builds extensions with (torchvision, cpp_extension): sysconfig's CC and CXX.
for var in CC CXX; do
  compiler=$(python -c "import sysconfig; print(sysconfig.get_config_var('$var').split()[0])")
  check_tool "$compiler"
  major=$("$compiler" -dumpversion | cut -d. -f1)
  [[ "$major" == "$gcc_major" ]] || fail "Python's $var ($compiler) is gcc $major, not gcc $gcc_major"
done
if [[ -n "${KILN_CUDA:-}" ]]; then
  check_tool nvcc
  nvcc_version=$(nvcc --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
  [[ "$nvcc_version" == "${KILN_CUDA}" ]] || fail "nvcc is CUDA $nvcc_version, the recipe asks for ${KILN_CUDA}"
  [[ "$(readlink -f "$(command -v nvcc)")" == "$(readlink -f "/usr/local/cuda-${KILN_CUDA}/bin/nvcc")" ]] \
    || fail "the nvcc on PATH is not /usr/local/cuda-${KILN_CUDA}/bin/nvcc (CUDA_HOME of the build)"
  test -f /usr/local/cuda/include/cudnn_version.h || fail "cuDNN headers missing from /usr/local/cuda/include"
  test -f /usr/local/cuda/include/nccl.h || fail "NCCL headers missing from /usr/local/cuda/include"
  # Compile and link a kernel for every arch of the recipe (nvcc refuses an arch it cannot target), then
  # run it: without a GPU the runtime answers cudaErrorInsufficientDriver or cudaErrorNoDevice.
  # shellcheck source=gencode.sh
  source "$(dirname "${BASH_SOURCE[0]}")/gencode.sh"
  mapfile -t gencode < <(gencode_flags "${KILN_CUDA_ARCH_LIST:?}")
  probe=$(mktemp -d)
  cat > "$probe/probe.cu" <<'CU'
#include <cstdio>
__global__ void kiln_add(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }
int main() {
  int n = -1;
  cudaError_t e = cudaGetDeviceCount(&n);
  std::printf("%s\n", cudaGetErrorName(e));
  return (e == cudaSuccess || e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice) ? 0 : 1;
}
CU
  nvcc "${gencode[@]}" -o "$probe/probe" "$probe/probe.cu" || fail "nvcc cannot build for ${KILN_CUDA_ARCH_LIST}"
  answer=$("$probe/probe") || fail "the CUDA probe built for ${KILN_CUDA_ARCH_LIST} does not run: $answer"
  rm -rf "$probe"
  echo "devel self-check: nvcc built and linked a kernel for ${KILN_CUDA_ARCH_LIST} (${#gencode[@]} targets); it runs ($answer)"
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
