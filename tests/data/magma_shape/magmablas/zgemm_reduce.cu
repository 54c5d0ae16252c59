__global__ void zgemm_reduce_kernel( int n, double* c ) { if ( threadIdx.x < n ) c[threadIdx.x] = 0.; }
