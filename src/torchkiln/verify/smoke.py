"""The runtime checks upstream's release engineering runs on every wheel, as functions that return a verdict.

``.ci/pytorch/smoke_test/smoke_test.py`` (``smoke_test_compile``, ``smoke_test_conv2d``, ``test_linalg``,
``test_sdpa``) and ``check_binary.sh`` (MKL/oneDNN present) run these as scripts that raise. Here each
returns what it saw, so the verification suite (``verify/test_release.py``) fails with it and torchkiln's
own tests can hand the same function a deliberately wrong input (a backend that miscompiles, oneDNN
switched off) and see it report the difference: the checker is what those tests test.

torch is imported inside the functions: this module loads without it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# What inductor's generated source contains when it really compiled a kernel: C++ for the CPU
# (``cpp_fused_*`` functions behind ``extern "C"``), triton for CUDA (``@triton.jit``).
KERNEL_MARKERS = {"cpu": "cpp_fused_", "cuda": "@triton.jit"}


@dataclass(frozen=True)
class Verdict:
    ok: bool
    message: str


def cxx_compiler() -> str | None:
    """The C++ compiler inductor's CPU backend runs (``torch._inductor.config.cpp.cxx``: $CXX, else g++), as
    torch finds it (it runs ``<cxx> --version``); None when there is none (the runtime images have none)."""
    from torch._inductor import cpp_builder

    try:
        return str(cpp_builder.get_cpp_compiler())
    except RuntimeError:  # torch._inductor.exc.InvalidCxxCompiler
        return None


def compile_against_eager(
    fn: Callable[..., Any],
    args: Sequence[Any],
    *,
    device: str,
    backend: str | Callable[..., Any] = "inductor",
    rtol: float | None = None,
    atol: float | None = None,
) -> Verdict:
    """``torch.compile(fn, fullgraph=True)`` run on ``args`` against ``fn`` itself (eager).

    With inductor, the generated source must hold a kernel for ``device`` (:data:`KERNEL_MARKERS`): a
    "compile" that ran nothing but eager fallbacks is not a working compiler. Outputs are compared with
    ``torch.testing.assert_close`` (its per-dtype tolerances unless ``rtol``/``atol`` are given)."""
    import torch
    from torch._inductor.utils import run_and_get_code

    name = getattr(fn, "__name__", type(fn).__name__)
    expected = fn(*args)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    if backend == "inductor":
        got, sources = run_and_get_code(compiled, *args)
        marker = KERNEL_MARKERS.get(device, "")
        if not any(marker in source for source in sources):
            return Verdict(
                False,
                f"{name}: inductor generated no {device} kernel (no {marker!r} in {len(sources)} sources)",
            )
    else:
        got = compiled(*args)
    try:
        torch.testing.assert_close(got, expected, rtol=rtol, atol=atol)
    except AssertionError as exc:
        detail = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        return Verdict(False, f"{name}: compiled ({_backend_name(backend)}) differs from eager: {detail}")
    return Verdict(True, f"{name}: compiled ({_backend_name(backend)}) equals eager on {device}")


def _backend_name(backend: str | Callable[..., Any]) -> str:
    return backend if isinstance(backend, str) else getattr(backend, "__name__", "custom backend")


def cpu_conv_ops() -> set[str]:
    """The aten operators a float32 ``conv2d`` on the CPU runs, as the profiler records them."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 16, 16, generator=generator)
    weight = torch.randn(16, 8, 3, 3, generator=generator)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.nn.functional.conv2d(x, weight, padding=1)
    return {event.key for event in prof.key_averages()}


def onednn_verdict(available: bool, claimed: bool | None, ops: set[str]) -> Verdict:
    """oneDNN (MKL-DNN) is compiled in and a CPU convolution really runs through it
    (``aten::mkldnn_convolution``; without it the convolution is ``aten::_slow_conv2d_forward``).
    ``claimed``: Build settings' USE_MKLDNN."""
    if not available:
        return Verdict(
            False,
            f"torch.backends.mkldnn.is_available() is False (Build settings USE_MKLDNN={claimed}): "
            "CPU convolutions run without oneDNN",
        )
    if "aten::mkldnn_convolution" not in ops:
        return Verdict(
            False,
            "oneDNN is available but conv2d did not run through it (no aten::mkldnn_convolution; ran "
            f"{', '.join(sorted(o for o in ops if 'conv' in o)) or 'no convolution op'})",
        )
    return Verdict(True, "conv2d ran through oneDNN (aten::mkldnn_convolution)")


MAGMA_DEPRECATED = re.compile(r"MAGMA.*deprecated", re.IGNORECASE | re.DOTALL)


def magma_retirement(op: str, messages: Sequence[str]) -> str | None:
    """torch's warning that ``op`` (``linalg.svd``) no longer runs through MAGMA, if one of ``messages`` is.

    Upstream retires MAGMA op by op since 2.11 (pytorch#172824 and the PRs after it); such an op warns that
    MAGMA is deprecated, naming itself ("linalg.svd: MAGMA, as a linear algebra backend, is deprecated ...
    linalg.svd will try dispatching to cuSOLVER instead"), and runs something else. The warning on preferring
    MAGMA at all ("The usage of MAGMA backend for linear algebra operations is deprecated ...", 2.11's
    Context.cpp) names no op: it comes with ops that still run through MAGMA too, so it is not one."""
    name = re.compile(rf"(?<!\w){re.escape(op.rsplit('.', 1)[-1])}(?!\w)")
    return next((m.strip() for m in messages if MAGMA_DEPRECATED.search(m) and name.search(m)), None)
