// Generated stand-in for one torchvision translation unit: ATen headers from the build venv's torch.
#include <ATen/core/Tensor.h>
#include <c10/util/irange.h>

#include <cstdint>

#include "../kiln_macros.h"

namespace kiln_vision_like {

int64_t codec_07(const at::Tensor& t) {
  int64_t acc = 107;
  for (const auto i : c10::irange(t.dim())) {
    acc += t.size(i) * 107;
  }
  return acc + t.numel() * numel_scale;
}

}  // namespace kiln_vision_like
