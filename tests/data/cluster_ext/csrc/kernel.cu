// One CUDA translation unit for the distributed-compile tests: nvcc splits it into cudafe++, cicc, ptxas
// and a host compile, each of which sccache can send to a build server.
__global__ void kiln_add(float* x, float v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += v;
}

void kiln_add_launch(float* x, float v, int n) { kiln_add<<<(n + 255) / 256, 256>>>(x, v, n); }
