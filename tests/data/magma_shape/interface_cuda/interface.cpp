#include <cstdio>
#include <cuda_runtime.h>
#include "magma.h"
#include "magma_config.h"

extern "C" void
magma_print_environment()
{
    int ndevices = 0;
    cudaError_t err = cudaGetDeviceCount( &ndevices );
    if ( err != cudaSuccess ) {
        printf( "%% no CUDA device: %s\n", cudaGetErrorName( err ) );
        return;
    }
    for( int dev = 0; dev < ndevices; ++dev ) {
        cudaDeviceProp prop;
        err = cudaGetDeviceProperties( &prop, dev );
        printf( "%% device %d: %s, %.1f MHz clock, %.1f MiB memory, capability %d.%d\n",
                dev,
                prop.name,
                prop.clockRate / 1000.,
                prop.totalGlobalMem / (1024.*1024.),
                prop.major,
                prop.minor );
        #ifdef MAGMA_HAVE_CUDA
        int arch = prop.major*100 + prop.minor*10;
        if ( arch < MAGMA_CUDA_ARCH_MIN ) {
            printf( "compiled for sm_%d and up\n", MAGMA_CUDA_ARCH_MIN / 10 );
        }
        #endif
    }
}
