#include "magma.h"

__global__ void zgeadd_kernel( int n, double alpha, const double* a, double* b )
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if ( i < n ) b[i] += alpha * a[i];
}

extern "C" int magma_zgeadd_launch( int n )
{
    zgeadd_kernel<<< (n + 63) / 64, 64 >>>( n, 1.0, nullptr, nullptr );
    return static_cast<int>( cudaGetLastError() );
}
