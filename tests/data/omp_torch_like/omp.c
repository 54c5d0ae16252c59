/* The stand-in's torch/lib/libtorch_cpu.so: an OpenMP parallel region, compiled with -fopenmp by the host's gcc,
   which links gcc's OpenMP runtime libgomp.so.1 as torch's own libtorch_cpu.so links it (ATen's parallel_for). */
#include <omp.h>

/* How many threads the parallel region ran on (each adds one), and the sum 1..n computed in parallel. */
int kiln_omp_threads(int wanted) {
    int ran = 0;
#pragma omp parallel num_threads(wanted) reduction(+ : ran)
    ran += 1;
    return ran;
}

long kiln_omp_sum(long n) {
    long total = 0;
#pragma omp parallel for reduction(+ : total)
    for (long i = 1; i <= n; i++) total += i;
    return total;
}
