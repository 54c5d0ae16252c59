#pragma once
#include <torch/types.h>

torch::Tensor scaled_add(const torch::Tensor& a, const torch::Tensor& b, double alpha);
