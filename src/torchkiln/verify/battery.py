"""The numerical-parity battery: one fixed set of computations, run in two environments and compared.

``torchkiln verify --compare-with REQ`` runs it in the environment under test and in a fresh venv holding
upstream's wheel (``REQ``); :mod:`torchkiln.verify.parity` compares the two results per operation. So this
file is **standard library + torch only**: in the reference venv it runs as a plain script,
``python battery.py --out FILE``, and writes one JSON document.

What it computes, on the CPU and (when one is usable) the CUDA device, in float32 and the reduced precisions
the device supports (bfloat16 and float16 on the CPU; float16, and bfloat16 where
``torch.cuda.is_bf16_supported()``): :data:`CASES` (matmul, conv2d, layer/batch norm, softmax, attention, a
small network's forward and backward, and denormal arithmetic). Inputs and parameters come from Python's
``random`` with a fixed seed per case, never from torch's generators, so both environments compute on the
same numbers whatever their torch does with seeds (torch's vectorised normal sampler differs by CPU
capability). Threads are pinned to one: the order of a reduction changes its float result.

Each output is stored as float64 values (exact for every dtype here) and the sha256 of its bytes in its own
dtype (identical bytes: identical results); an operation the device or dtype does not support is recorded
with its error instead.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import random
import struct
import sys
from collections.abc import Callable
from typing import Any

FORMAT = 1
SEED = 20260701


def _torch() -> Any:
    import torch

    return torch


# Every input value the battery generated, in order: both sides must have computed on the same numbers.
_INPUTS = hashlib.sha256()


def _values(shape: tuple[int, ...], seed: int, scale: float = 1.0) -> Any:
    """A float64 tensor of N(0, scale) values from Python's own generator (the same in every environment)."""
    torch = _torch()
    rng = random.Random(seed)
    count = 1
    for n in shape:
        count *= n
    values = [rng.gauss(0.0, scale) for _ in range(count)]
    _INPUTS.update(struct.pack(f"<{count}d", *values))
    return torch.tensor(values, dtype=torch.float64).reshape(shape)


def _on(tensor: Any, device: str, dtype: Any) -> Any:
    return tensor.to(dtype=dtype).to(device)


def matmul(device: str, dtype: Any) -> dict[str, Any]:
    a, b = _values((64, 96), SEED + 1), _values((96, 48), SEED + 2)
    return {"out": _on(a, device, dtype) @ _on(b, device, dtype)}


def conv2d(device: str, dtype: Any) -> dict[str, Any]:
    torch = _torch()
    x, w, b = (
        _values((2, 8, 16, 16), SEED + 3),
        _values((16, 8, 3, 3), SEED + 4, 0.2),
        _values((16,), SEED + 5),
    )
    out = torch.nn.functional.conv2d(
        _on(x, device, dtype), _on(w, device, dtype), _on(b, device, dtype), padding=1
    )
    return {"out": out}


def norms(device: str, dtype: Any) -> dict[str, Any]:
    torch = _torch()
    f = torch.nn.functional
    x = _on(_values((8, 64), SEED + 6, 3.0), device, dtype)
    weight, bias = _on(_values((64,), SEED + 7), device, dtype), _on(_values((64,), SEED + 8), device, dtype)
    images = _on(_values((4, 16, 8, 8), SEED + 9, 2.0), device, dtype)
    return {
        "layer_norm": f.layer_norm(x, (64,), weight, bias),
        "batch_norm": f.batch_norm(images, None, None, training=True),
    }


def softmax(device: str, dtype: Any) -> dict[str, Any]:
    torch = _torch()
    x = _on(_values((16, 128), SEED + 10, 4.0), device, dtype)
    return {"softmax": torch.softmax(x, -1), "log_softmax": torch.log_softmax(x, -1)}


def attention(device: str, dtype: Any) -> dict[str, Any]:
    torch = _torch()
    q, k, v = (_on(_values((2, 4, 32, 16), SEED + 11 + i), device, dtype) for i in range(3))
    return {"out": torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)}


def model(device: str, dtype: Any) -> dict[str, Any]:
    """A small network's forward and backward: conv, ReLU, pooling, linear, cross-entropy; its loss and the
    gradient of every parameter."""
    torch = _torch()
    f = torch.nn.functional
    params = {
        "conv.weight": _values((8, 3, 3, 3), SEED + 20, 0.3),
        "conv.bias": _values((8,), SEED + 21, 0.1),
        "fc.weight": _values((10, 8 * 4 * 4), SEED + 22, 0.1),
        "fc.bias": _values((10,), SEED + 23, 0.1),
    }
    p = {name: _on(t, device, dtype).requires_grad_() for name, t in params.items()}
    x = _on(_values((4, 3, 8, 8), SEED + 24), device, dtype)
    target = torch.tensor([3, 1, 4, 1], device=device)
    hidden = f.avg_pool2d(f.relu(f.conv2d(x, p["conv.weight"], p["conv.bias"], padding=1)), 2)
    logits = f.linear(hidden.flatten(1), p["fc.weight"], p["fc.bias"])
    loss = f.cross_entropy(logits, target)
    loss.backward()
    return {"loss": loss.detach(), **{f"grad.{name}": t.grad for name, t in p.items()}}


def denormals(device: str, dtype: Any) -> dict[str, Any]:
    """Products of subnormal numbers: IEEE 754 rounds them exactly, so every correct build gives the same
    bits, and a build or process that flushes denormals to zero (``-ffast-math``'s crtfastmath.o,
    ``torch.set_flush_denormal(True)``) gives zeros."""
    torch = _torch()
    tiny = torch.finfo(dtype).tiny
    rng = random.Random(SEED + 30)
    values = [tiny * rng.uniform(0.01, 0.99) for _ in range(64)]
    _INPUTS.update(struct.pack("<64d", *values))
    x = _on(torch.tensor(values, dtype=torch.float64), device, dtype)
    return {"half": x * 0.5, "triple": x * 3}


CASES: dict[str, Callable[[str, Any], dict[str, Any]]] = {
    "matmul": matmul,
    "conv2d": conv2d,
    "norms": norms,
    "softmax": softmax,
    "attention": attention,
    "model": model,
    "denormals": denormals,
}


def devices() -> dict[str, list[str]]:
    """device -> the dtypes it runs: float32 and the reduced precisions it supports."""
    torch = _torch()
    found = {"cpu": ["float32", "bfloat16", "float16"]}
    if torch.cuda.is_available():
        found["cuda"] = ["float32", "float16"] + (["bfloat16"] if torch.cuda.is_bf16_supported() else [])
    return found


def _encode(tensor: Any) -> dict[str, Any]:
    torch = _torch()
    native = tensor.detach().cpu().contiguous().reshape(-1)  # a 0-d tensor (a loss) cannot be viewed as bytes
    wide = native.to(torch.float64)
    return {
        "dtype": str(native.dtype).removeprefix("torch."),
        "shape": list(tensor.shape),
        "sha256": hashlib.sha256(bytes(native.view(torch.uint8).tolist())).hexdigest(),
        "float64": base64.b64encode(bytes(wide.view(torch.uint8).tolist())).decode(),
    }


def run_case(name: str, device: str, dtype_name: str) -> dict[str, Any]:
    torch = _torch()
    try:
        outputs = CASES[name](device, getattr(torch, dtype_name))
    except (RuntimeError, NotImplementedError, TypeError) as exc:  # "not implemented for 'Half'"
        return {"unsupported": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"}
    return {"outputs": {key: _encode(value) for key, value in sorted(outputs.items())}}


def run() -> dict[str, Any]:
    torch = _torch()
    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    for device, dtypes in devices().items():
        for dtype_name in dtypes:
            for name in CASES:
                results[f"{name}/{device}/{dtype_name}"] = run_case(name, device, dtype_name)
    return {
        "format": FORMAT,
        "torch": {
            "version": str(torch.__version__),
            "git_version": torch.version.git_version,
            "cuda": torch.version.cuda,
            "location": str(torch.__file__),
            "threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "devices": {d: (torch.cuda.get_device_name() if d == "cuda" else "cpu") for d in devices()},
        },
        "python": sys.version.split()[0],
        "inputs_sha256": _INPUTS.hexdigest(),
        "cases": results,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="torchkiln's numerical-parity battery (stdlib + torch only)")
    parser.add_argument("--out", required=True, help="where to write the results (JSON)")
    args = parser.parse_args(argv)
    text = json.dumps(run(), sort_keys=True)
    with open(args.out, "w", encoding="utf-8") as stream:
        stream.write(text + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a script in each environment
    sys.exit(main())
