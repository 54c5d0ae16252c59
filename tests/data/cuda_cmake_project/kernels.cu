// Device code for every architecture of CMAKE_CUDA_ARCHITECTURES, and a host call into cuBLAS.
#include <cublas_v2.h>
#include <cuda_runtime.h>

__global__ void kiln_axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" int kiln_launch(float a, const float* x, float* y, int n) {
  kiln_axpy<<<(n + 255) / 256, 256>>>(a, x, y, n);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int kiln_cublas_version() {
  int major = 0;
  cublasGetProperty(MAJOR_VERSION, &major);
  return major;
}
