// Included by every operator and codec unit, as torchvision's csrc/macros.h is (through its ops headers) by
// most of its units: an edit here recompiles 42 of the 44 units (bench/edits.py's header row).
#pragma once

#include <cstdint>

namespace kiln_vision_like {

constexpr int64_t numel_scale = 1;

}  // namespace kiln_vision_like
