#include "ops.h"

at::Tensor kiln_scale(const at::Tensor& x, double factor) {
  return x.mul(factor);
}
