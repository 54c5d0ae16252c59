// The driver API, as libcaffe2_nvrtc.so uses it: linked against the toolkit's lib/stubs/libcuda.so, so the
// library records libcuda.so.1 (the real driver's soname) and loads only where a driver is installed.
#include <cuda.h>

extern "C" int kiln_driver_init() { return static_cast<int>(cuInit(0)); }
