#include <torch/extension.h>

#include "ops.h"

PYBIND11_MODULE(_C, m) {
  m.def("scale", &kiln_scale, "x * factor");
  m.def("clamp", &kiln_clamp, "x clamped to [low, high]");
}
