"""Run in a fresh process by the CUDA visibility checks; prints one JSON object on stdout.

A fresh process matters: the CUDA runtime reads CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER once, when it
initialises, and torch caches the device count after that. Modes:

* ``devices``: device count before CUDA init (NVML based) and after (CUDA runtime), and each visible
  device's name, UUID and capability.
* ``kernels``: on every visible device, launch real kernels (elementwise, reduction, matmul, conv, RNN, a
  training step, SVD) and compare with CPU results; report bf16 support and the compiled arch list.
* ``assert_async``: ``torch._assert_async`` on a CUDA zero must surface as a RuntimeError naming CUDA
  (device-side errors are captured, not lost). Poisons the CUDA context, hence its own process.
* ``cpu_build``: what a torch built without CUDA reports and raises.
"""

from __future__ import annotations

import json
import sys
import traceback


def _uuid(props: object) -> str | None:
    raw = getattr(props, "uuid", None)
    return str(raw).lower().removeprefix("gpu-") if raw is not None else None


def _nvml_uuids(torch) -> list[str] | None:  # noqa: ANN001
    """NVML's own device order (PCI bus order), all devices, ignoring CUDA_VISIBLE_DEVICES."""
    raw = getattr(torch.cuda, "_raw_device_uuid_nvml", None)
    try:
        uuids = raw() if raw is not None else None
    except OSError:  # no libnvidia-ml.so.1
        return None
    return [u.lower().removeprefix("gpu-") for u in uuids] if uuids else None


def devices() -> dict:
    import torch

    before = torch.cuda.device_count()  # NVML + CUDA_VISIBLE_DEVICES, does not initialise CUDA
    available = torch.cuda.is_available()
    runtime = torch._C._cuda_getDeviceCount() if torch.version.cuda else 0
    listed = []
    for i in range(runtime):
        props = torch.cuda.get_device_properties(i)
        listed.append(
            {
                "index": i,
                "name": props.name,
                "uuid": _uuid(props),
                "capability": [props.major, props.minor],
                "pci_bus_id": getattr(props, "pci_bus_id", None),
            }
        )
    return {
        "count_before_init": before,
        "is_available": available,
        "runtime_count": runtime,
        "devices": listed,
        "nvml_uuids": _nvml_uuids(torch) if torch.version.cuda else None,
    }


def _elementwise(torch, dev) -> float:  # noqa: ANN001 - torch module and device
    x = torch.arange(1024, device=dev, dtype=torch.float32)
    got = (x * 2).sum().item()
    if got != 2 * sum(range(1024)):
        raise AssertionError(f"(arange(1024)*2).sum() = {got}, expected {2 * sum(range(1024))}")
    return got


def _matmul(torch, dev) -> float:  # noqa: ANN001
    a, b = torch.randn(128, 64, dtype=torch.float64), torch.randn(64, 32, dtype=torch.float64)
    got = (a.float().to(dev) @ b.float().to(dev)).cpu().double()
    err = (got - a @ b).abs().max().item()
    if err > 1e-3:
        raise AssertionError(f"fp32 matmul differs from CPU fp64 by {err}")
    return err


def _conv(torch, dev) -> float:  # noqa: ANN001
    conv = torch.nn.Conv2d(16, 33, 3, stride=2, padding=1)
    x = torch.randn(4, 16, 20, 30)
    ref = conv(x)
    got = conv.to(dev)(x.to(dev)).cpu()
    err = (got - ref).abs().max().item()
    if err > 1e-3:
        raise AssertionError(f"conv2d differs from CPU by {err}")
    with torch.autocast("cuda", dtype=torch.float16):  # smoke_test.py: conv under autocast
        half = conv(x.to(dev))
    if half.dtype != torch.float16 or not bool(torch.isfinite(half).all()):
        raise AssertionError(f"conv2d under fp16 autocast gave dtype {half.dtype} or non-finite values")
    return err


def _rnn(torch, dev) -> list[int]:  # noqa: ANN001 - check_binary.sh rnn_smoke.py
    model = torch.nn.RNN(10, 20, 2).to(dev)
    output, _ = model(torch.randn(5, 3, 10, device=dev), torch.randn(2, 3, 20, device=dev))
    return list(output.shape)


def _train_step(torch, dev) -> float:  # noqa: ANN001 - check_binary.sh cnn_smoke.py
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(8 * 15 * 15, 10)
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    before = [p.detach().clone() for p in model.parameters()]
    loss = torch.nn.functional.mse_loss(
        model(torch.randn(4, 3, 32, 32, device=dev)), torch.randn(4, 10, device=dev)
    )
    loss.backward()
    opt.step()
    if all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True)):
        raise AssertionError("an SGD step left every parameter unchanged")
    return loss.item()


def _svd(torch, dev) -> float:  # noqa: ANN001 - check_binary.sh: linalg.svd(x.t() @ x) on CUDA
    a = torch.randn(20, 16, device=dev, dtype=torch.float64)
    u, s, vh = torch.linalg.svd(a.t() @ a)
    err = (u @ torch.diag(s) @ vh - a.t() @ a).abs().max().item()
    if err > 1e-6:
        raise AssertionError(f"SVD reconstruction error {err}")
    return err


def _bf16(torch, dev) -> dict:  # noqa: ANN001
    major, _ = torch.cuda.get_device_capability(dev)
    native = torch.cuda.is_bf16_supported(including_emulation=False)
    result = {"native": native, "expected_native": major >= 8}
    if native:
        a = torch.randn(64, 64, device=dev, dtype=torch.bfloat16)
        result["matmul_finite"] = bool(torch.isfinite(a @ a).all())
    return result


DEVICE_CHECKS = {
    "elementwise": _elementwise,
    "matmul": _matmul,
    "conv": _conv,
    "rnn": _rnn,
    "train_step": _train_step,
    "svd": _svd,
    "bf16": _bf16,
}


def kernels() -> dict:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out: dict = {"arch_list": torch.cuda.get_arch_list(), "devices": []}
    for i in range(torch.cuda.device_count()):
        dev = torch.device("cuda", i)
        torch.cuda.set_device(dev)  # is_bf16_supported() asks about the current device
        major, minor = torch.cuda.get_device_capability(i)
        checks: dict = {}
        for name, fn in DEVICE_CHECKS.items():
            torch.manual_seed(0)
            try:
                checks[name] = {"ok": True, "value": fn(torch, dev)}
                torch.cuda.synchronize(dev)  # surface asynchronous launch errors in this check
            except Exception as exc:  # noqa: BLE001 - every failure is reported, with its message
                checks[name] = {
                    "ok": False,
                    "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}",
                }
        out["devices"].append(
            {
                "index": i,
                "name": torch.cuda.get_device_name(i),
                "capability": [major, minor],
                "checks": checks,
            }
        )
    count = torch.cuda.device_count()
    if count < 8:  # check_binary.sh: an invalid ordinal raises (linker regression pytorch#57744)
        try:
            torch.eye(7, 7, device=f"cuda:{count}")
            out["invalid_ordinal"] = {"ok": False, "error": f"torch.eye(device='cuda:{count}') did not raise"}
        except RuntimeError as exc:  # torch.AcceleratorError is a RuntimeError
            out["invalid_ordinal"] = {"ok": True, "value": str(exc).strip().splitlines()[0]}
        except Exception as exc:  # noqa: BLE001 - the wrong kind of error is reported, not a crash
            out["invalid_ordinal"] = {
                "ok": False,
                "error": f"raised {type(exc).__name__}, not RuntimeError: {exc}",
            }
    return out


def assert_async() -> dict:
    import torch

    try:
        torch._assert_async(torch.tensor(0, device="cuda"))
        torch.cuda.synchronize()
    except RuntimeError as exc:
        return {"raised": True, "type": type(exc).__name__, "message": str(exc).strip().splitlines()[0]}
    except Exception as exc:  # noqa: BLE001
        return {"raised": False, "type": type(exc).__name__, "message": f"not a RuntimeError: {exc}"}
    return {"raised": False, "message": "no error"}


def cpu_build() -> dict:
    import torch

    out: dict = {
        "is_available": torch.cuda.is_available(),
        "device_count": torch.cuda.device_count(),
        "version_cuda": torch.version.cuda,
        "arch_list": torch.cuda.get_arch_list(),
        "is_built": torch.backends.cuda.is_built(),
        "bf16_supported": torch.cuda.is_bf16_supported(),
        "cudnn_version": torch.backends.cudnn.version(),
        "calls": {},
    }
    calls = {
        "torch.cuda.init()": lambda: torch.cuda.init(),
        "torch.cuda.current_device()": lambda: torch.cuda.current_device(),
        "torch.cuda.get_device_name()": lambda: torch.cuda.get_device_name(),
        "torch.zeros(1, device='cuda')": lambda: torch.zeros(1, device="cuda"),
    }
    for name, fn in calls.items():
        try:
            fn()
            out["calls"][name] = None
        except Exception as exc:  # noqa: BLE001 - report type and message
            out["calls"][name] = f"{type(exc).__name__}: {exc}"
    return out


MODES = {"devices": devices, "kernels": kernels, "assert_async": assert_async, "cpu_build": cpu_build}

if __name__ == "__main__":
    try:
        result = MODES[sys.argv[1]]()
    except Exception:  # noqa: BLE001 - the parent shows this
        traceback.print_exc()
        sys.exit(3)
    print(json.dumps(result))
