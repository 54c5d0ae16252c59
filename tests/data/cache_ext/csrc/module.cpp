#include <torch/extension.h>

#include "ops.h"

#ifdef KILN_WITH_CUDA
int kiln_fill_launch_status();
#endif

PYBIND11_MODULE(_C, m) {
  m.def("scale", &kiln_scale, "x * factor");
  m.def("clamp", &kiln_clamp, "x clamped to [low, high]");
#ifdef KILN_WITH_CUDA
  m.def("cuda_launch_status", &kiln_fill_launch_status, "cudaError_t of a kernel launch");
#endif
}
