#ifdef KILN_BINDINGS_ONLY
// torch's pybind11 casters for at::Tensor alone (torch/python.h includes them): a third of the compile of
// <torch/extension.h>, which adds torch/all.h, the whole C++ frontend, that a binding does not use. The
// emulated arm64 check builds it so (KILN_CACHE_EXT_BINDINGS_ONLY=1), where that header is minutes of cc1plus.
#include <torch/csrc/utils/pybind.h>
#else
#include <torch/extension.h>
#endif

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
