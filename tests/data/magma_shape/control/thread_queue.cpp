#include <cstdio>
#include <cstring>
#include <exception>
#include "magma.h"

static void check( int err )
{
    if ( err != 0 ) {
        fprintf( stderr, "Error: %s (%d)\n", strerror(err), err );
        throw std::exception();
    }
}

extern "C" int magma_thread_queue_push( int quit_flag )
{
    check( 0 );
    if ( quit_flag ) {
        fprintf( stderr, "Error: push_task() called after quit()\n" );
        throw std::exception();
    }
    return 0;
}
