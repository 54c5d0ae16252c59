"""Run in a fresh process by the release area: build a CUDA extension against this torch with nvcc
(``torch.utils.cpp_extension.load_inline``, ninja), load it and run its kernel on ``cuda:0``. Prints one JSON
object. A source build whose headers, CUDA_HOME or ABI are wrong fails here the way a user's extension would
(pytorch's own ``test_cpp_extensions_jit`` does the same with its ``cuda_extension.cu``).

The kernel is compiled for the device's own capability only (TORCH_CUDA_ARCH_LIST, set before the build), so
one nvcc pass; its ``CUDA_VERSION`` macro says which toolkit compiled it.

Usage: python cuda_extension.py BUILD_DIR
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import traceback

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <cuda_runtime.h>

__global__ void kiln_axpb(const float* x, float* y, float a, float b, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + b;
}

torch::Tensor axpb(torch::Tensor x, double a, double b) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat && x.is_contiguous(), "a contiguous CUDA float tensor");
  auto y = torch::empty_like(x);
  int64_t n = x.numel();
  int threads = 256;
  int blocks = (int)((n + threads - 1) / threads);
  kiln_axpb<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<float>(), y.data_ptr<float>(), (float)a, (float)b, n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

int64_t built_with_cuda() { return CUDA_VERSION; }
"""
CPP_SOURCE = "torch::Tensor axpb(torch::Tensor x, double a, double b);\nint64_t built_with_cuda();\n"


def main(build_dir: str) -> dict:
    import torch
    from torch.utils import cpp_extension

    out: dict = {"cuda_home": cpp_extension.CUDA_HOME, "nvcc": shutil.which("nvcc")}
    major, minor = torch.cuda.get_device_capability(0)
    os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
    out["arch"] = f"sm_{major}{minor}"
    started = time.monotonic()
    module = cpp_extension.load_inline(
        name="kiln_cuda_extension",
        cpp_sources=CPP_SOURCE,
        cuda_sources=CUDA_SOURCE,
        functions=["axpb", "built_with_cuda"],
        build_directory=build_dir,
        with_cuda=True,
        verbose=False,
    )
    out["build_s"] = round(time.monotonic() - started, 1)
    out["module"] = module.__file__
    code = int(module.built_with_cuda())  # CUDA_VERSION: 13000 for 13.0
    out["built_with_cuda"] = f"{code // 1000}.{code % 1000 // 10}"
    x = torch.arange(1 << 16, dtype=torch.float32, device="cuda") / 7
    y = module.axpb(x, 3.0, 0.5)
    torch.cuda.synchronize()
    out["matches"] = bool(torch.equal(y.cpu(), (3.0 * x + 0.5).cpu()))
    return out


if __name__ == "__main__":
    try:
        result = main(sys.argv[1])
    except Exception as exc:  # noqa: BLE001 - reported to the test as data
        result = {
            "error": f"{type(exc).__name__}: {exc}".strip()[:4000],
            "traceback": traceback.format_exc()[-4000:],
        }
    print(json.dumps(result))
