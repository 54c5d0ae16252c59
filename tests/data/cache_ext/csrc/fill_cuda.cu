// The extension's CUDA part (built when KILN_CACHE_EXT_CUDA=1): device code for every arch of
// TORCH_CUDA_ARCH_LIST, compiled by nvcc through the compiler cache like torchvision's CUDA ops.
#include <cstdint>
#include <cuda_runtime.h>

__global__ void kiln_fill_kernel(float* out, float value, int64_t n) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value;
}

// Launches on nothing and returns the runtime's answer: cudaSuccess on a GPU, the driver error without one.
int kiln_fill_launch_status() {
  kiln_fill_kernel<<<1, 32>>>(nullptr, 0.0f, 0);
  return static_cast<int>(cudaGetLastError());
}
