/* The stand-in's CUDA library: asks the CUDA runtime and cuBLAS for their versions (no GPU needed). */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

int torchlike_cuda_versions(int *runtime, int *cublas_major, int *cublas_minor) {
    if (cudaRuntimeGetVersion(runtime) != cudaSuccess) return 1;
    if (cublasGetProperty(MAJOR_VERSION, cublas_major) != CUBLAS_STATUS_SUCCESS) return 2;
    if (cublasGetProperty(MINOR_VERSION, cublas_minor) != CUBLAS_STATUS_SUCCESS) return 3;
    return 0;
}
