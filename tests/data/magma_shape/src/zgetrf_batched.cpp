#include "magma.h"

enum { KILN_SHFL = 1, KILN_NOSHFL = 2 };
static magma_int_t magma_zgetrf_batched_smallsq_shfl( magma_int_t m ) { return m > 0 ? KILN_SHFL : 0; }
static magma_int_t magma_zgetrf_batched_smallsq_noshfl( magma_int_t m ) { return m > 0 ? KILN_NOSHFL : 0; }

extern "C" magma_int_t
magma_zgetrf_batched( magma_int_t m, magma_int_t arch )
{
        if( arch < 700 ) {
            return magma_zgetrf_batched_smallsq_noshfl( m );
        }
        else{
            return magma_zgetrf_batched_smallsq_shfl( m );
        }
}
