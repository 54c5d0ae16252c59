// Runs without a GPU: library versions only (no device is touched). Exit 1 on a mismatch.
#include <cstdio>
#include <cstring>
#include <cudnn.h>
#include <cuda_runtime.h>
#include <cusparseLt.h>
#include <nccl.h>

extern "C" int kiln_cublas_version();

int main() {
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  size_t cudnn = cudnnGetVersion();
  int nccl = 0;
  ncclGetVersion(&nccl);
  char cudnn_text[32];
  std::snprintf(cudnn_text, sizeof cudnn_text, "%zu.%zu.%zu", cudnn / 10000, cudnn / 100 % 100, cudnn % 100);
  std::printf("cudart %d\ncublas %d\ncudnn %s\nnccl %d\n", runtime, kiln_cublas_version(), cudnn_text, nccl);
#ifdef KILN_EXPECT_CUDNN
  if (std::strcmp(cudnn_text, KILN_EXPECT_CUDNN) != 0) {
    std::printf("cudnn library %s, expected %s\n", cudnn_text, KILN_EXPECT_CUDNN);
    return 1;
  }
#endif
  return cudnn == CUDNN_VERSION ? 0 : 1;  // the library is the header's version
}
