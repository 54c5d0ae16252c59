#ifndef MAGMA_SHAPE_H
#define MAGMA_SHAPE_H
#include <cuda.h>  /* for CUDA_VERSION, as the release's magma_types.h */
#ifdef __cplusplus
extern "C" {
#endif
typedef int magma_int_t;
void magma_get_zgetrf_batched_nbparam(magma_int_t n, magma_int_t *nb, magma_int_t *recnb);
void magma_get_cgetrf_batched_nbparam(magma_int_t n, magma_int_t *nb, magma_int_t *recnb);
void magma_get_dgetrf_batched_nbparam(magma_int_t n, magma_int_t *nb, magma_int_t *recnb);
void magma_get_sgetrf_batched_nbparam(magma_int_t n, magma_int_t *nb, magma_int_t *recnb);
void magma_get_spotrf_batched_nbparam(magma_int_t n, magma_int_t *nb, magma_int_t *recnb);
magma_int_t magma_zgetrf_batched(magma_int_t m, magma_int_t arch);
void magma_print_environment(void);
int magma_zgeadd_launch(int n);
int magma_thread_queue_push(int quit_flag);
#ifdef __cplusplus
}
#endif
#endif
