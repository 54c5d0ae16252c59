"""Area 2, CUDA visibility: which devices torch sees, in which order, and whether kernels run on them.

Each CUDA_VISIBLE_DEVICES value is tried in a fresh process (the CUDA runtime reads it once, at init).
Every visible device must be covered by the compiled arch list *and* run real kernels: the arch check
explains a failure, the launch proves it ("no kernel image is available for execution on the device").
On a CPU build, torch must report no CUDA everywhere and a CUDA call must fail with the documented error.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from torchkiln.recipe import archs
from torchkiln.verify import proc, report

pytestmark = [pytest.mark.cuda_visibility, pytest.mark.timeout(300)]
PROBE_TIMEOUT = 180.0
NOT_COMPILED = "Torch not compiled with CUDA enabled"


def probe(helpers: Path, mode: str, env: dict[str, str]) -> dict:
    result = proc.python(helpers / "cuda_probe.py", mode, timeout=PROBE_TIMEOUT, env=env)
    assert not result.timed_out, f"cuda_probe {mode} hung: {result.describe()}"
    assert result.returncode == 0, result.describe()
    return json.loads(result.stdout.strip().splitlines()[-1])


def env_with(base: dict[str, str], visible: str | None, order: str | None = "PCI_BUS_ID") -> dict[str, str]:
    env = dict(base)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    if order is not None:
        env["CUDA_DEVICE_ORDER"] = order
    return env


# --- pure parsing: PyTorch's own CUDA_VISIBLE_DEVICES parser (runs on every build) -------------------


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("", []),
        ("1,0", [1, 0]),
        ("2,0,1", [2, 0, 1]),
        ("0,0", []),
        ("1,-1,2", [1]),
        (" 1, 2", [1, 2]),
        ("-1", []),
        ("abc", []),
        ("GPU-8932f937,1", ["GPU-8932f937"]),
    ],
)
def test_visible_devices_parser(monkeypatch: pytest.MonkeyPatch, value: str, parsed: list) -> None:
    parse = getattr(torch.cuda, "_parse_visible_devices", None)
    if parse is None:
        pytest.skip(f"torch {torch.__version__} has no torch.cuda._parse_visible_devices")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    assert list(parse()) == parsed


# --- CPU build ----------------------------------------------------------------------------------------


@pytest.mark.cpu_build
def test_cpu_build_reports_no_cuda() -> None:
    assert torch.cuda.is_available() is False
    assert torch.cuda.device_count() == 0
    assert torch.cuda.get_arch_list() == []
    assert torch.backends.cuda.is_built() is False
    assert torch.cuda.is_bf16_supported() is False
    assert torch.backends.cudnn.version() is None
    assert torch.cuda.has_magma is False


@pytest.mark.cpu_build
@pytest.mark.parametrize(
    "call",
    [
        lambda: torch.cuda.init(),
        lambda: torch.cuda.current_device(),
        lambda: torch.cuda.get_device_capability(),
        lambda: torch.cuda.get_device_name(),
        lambda: torch.zeros(1, device="cuda"),
    ],
    ids=["init", "current_device", "get_device_capability", "get_device_name", "zeros-on-cuda"],
)
def test_cpu_build_cuda_call_fails_documented(call) -> None:  # noqa: ANN001
    with pytest.raises(AssertionError, match=NOT_COMPILED):
        call()


@pytest.mark.cpu_build
def test_cpu_build_fresh_process_with_visible_devices(helpers: Path, child_env: dict[str, str]) -> None:
    """Even with CUDA_VISIBLE_DEVICES naming a device, a CPU build reports no CUDA, consistently."""
    got = probe(helpers, "cpu_build", env_with(child_env, "0"))
    assert (got["is_available"], got["device_count"], got["version_cuda"], got["arch_list"]) == (
        False,
        0,
        None,
        [],
    )
    for name, error in got["calls"].items():
        assert error is not None and NOT_COMPILED in error, f"{name}: {error}"


# --- CUDA: visibility in fresh processes --------------------------------------------------------------


@pytest.fixture(scope="module")
def baseline(helpers: Path) -> dict:
    """Devices with CUDA_VISIBLE_DEVICES unset and PCI bus order: the reference for every other case."""
    env = dict(os.environ)
    got = probe(helpers, "devices", env_with(env, None))
    if got["runtime_count"] == 0:
        pytest.skip("no CUDA device visible with CUDA_VISIBLE_DEVICES unset")
    return got


# (CUDA_VISIBLE_DEVICES template, indices into the baseline that must be visible, in order).
# {n} is the device count: an index that does not exist, which (like -1) ends the list.
VISIBILITY_CASES = [
    ("", []),
    ("0", [0]),
    ("-1", []),
    ("0,-1", [0]),
    ("-1,0", []),
    ("{n}", []),
    ("0,{n}", [0]),
]


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("template", "expected"), VISIBILITY_CASES, ids=[repr(c[0]) for c in VISIBILITY_CASES]
)
def test_visible_devices_count(helpers: Path, baseline: dict, template: str, expected: list[int]) -> None:
    value = template.format(n=baseline["runtime_count"])
    got = probe(helpers, "devices", env_with(dict(os.environ), value))
    want = [baseline["devices"][i]["uuid"] for i in expected]
    assert got["count_before_init"] == len(expected), (
        f"CUDA_VISIBLE_DEVICES={value!r}: torch.cuda.device_count() before init = {got['count_before_init']}, "
        f"expected {len(expected)}"
    )
    assert got["runtime_count"] == len(expected), (
        f"CUDA_VISIBLE_DEVICES={value!r}: CUDA runtime sees {got['runtime_count']}, expected {len(expected)}"
    )
    assert [d["uuid"] for d in got["devices"]] == want
    assert got["is_available"] == bool(expected)


@pytest.mark.cuda
@pytest.mark.multi_gpu
def test_visible_devices_order_preserved(helpers: Path, baseline: dict) -> None:
    n = baseline["runtime_count"]
    order = list(range(n))[::-1]
    got = probe(helpers, "devices", env_with(dict(os.environ), ",".join(map(str, order))))
    assert [d["uuid"] for d in got["devices"]] == [baseline["devices"][i]["uuid"] for i in order]


def _nvml_uuids() -> list[str] | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    result = proc.run([smi, "--query-gpu=index,uuid", "--format=csv,noheader"], timeout=60)
    if result.returncode != 0:
        return None
    rows = [line.split(",") for line in result.stdout.strip().splitlines() if line.strip()]
    return [uuid.strip().lower().removeprefix("gpu-") for _, uuid in sorted(rows, key=lambda r: int(r[0]))]


@pytest.mark.cuda
def test_pci_bus_order_matches_nvml(baseline: dict) -> None:
    """With CUDA_DEVICE_ORDER=PCI_BUS_ID, cuda:N is NVML's (nvidia-smi's) GPU N, compared by UUID."""
    cuda_order = [d["uuid"] for d in baseline["devices"]]
    sources = {
        "NVML (torch.cuda._raw_device_uuid_nvml)": baseline.get("nvml_uuids"),
        "nvidia-smi": _nvml_uuids(),
    }
    compared = {name: uuids for name, uuids in sources.items() if uuids is not None}
    if not compared:
        pytest.skip("neither NVML (libnvidia-ml.so.1) nor nvidia-smi is available to list the PCI order")
    for name, uuids in compared.items():
        assert cuda_order == uuids, f"CUDA order {cuda_order} differs from {name} order {uuids}"


# --- CUDA: kernels on every visible device --------------------------------------------------------------


@pytest.fixture(scope="module")
def kernel_probe(helpers: Path) -> dict:
    return probe(helpers, "kernels", dict(os.environ))


@pytest.mark.cuda
def test_every_device_covered_by_arch_list(kernel_probe: dict) -> None:
    arch_list = kernel_probe["arch_list"]
    assert arch_list, "torch.cuda.get_arch_list() is empty on a CUDA build"
    uncovered = [
        f"cuda:{d['index']} {d['name']} (capability {d['capability'][0]}.{d['capability'][1]})"
        for d in kernel_probe["devices"]
        if not archs.covering(arch_list, tuple(d["capability"]))
    ]
    assert not uncovered, f"no kernel image for {uncovered}: compiled arch list {arch_list}"


@pytest.mark.cuda
@pytest.mark.parametrize("check", ["elementwise", "matmul", "conv", "rnn", "train_step", "svd"])
def test_kernels_run_on_every_device(kernel_probe: dict, check: str) -> None:
    failures = [
        f"cuda:{d['index']} {d['name']}: {d['checks'][check]['error']}"
        for d in kernel_probe["devices"]
        if not d["checks"][check]["ok"]
    ]
    assert not failures, "; ".join(failures)


@pytest.mark.cuda
def test_bf16_support_reported_natively(kernel_probe: dict) -> None:
    """is_bf16_supported(including_emulation=False) is True exactly on capability >= 8.0, and bf16 runs."""
    for d in kernel_probe["devices"]:
        check = d["checks"]["bf16"]
        assert check["ok"], f"cuda:{d['index']}: {check['error']}"
        value = check["value"]
        assert value["native"] == value["expected_native"], (
            f"cuda:{d['index']} {d['name']} capability {d['capability']}: native bf16 reported "
            f"{value['native']}, expected {value['expected_native']}"
        )
        if value["native"]:
            assert value["matmul_finite"], f"cuda:{d['index']}: bf16 matmul produced non-finite values"


@pytest.mark.cuda
def test_invalid_device_ordinal_raises(kernel_probe: dict) -> None:
    if "invalid_ordinal" not in kernel_probe:
        pytest.skip(
            report.not_applicable("8 or more devices visible: no invalid ordinal below cuda:8 to try")
        )
    assert kernel_probe["invalid_ordinal"]["ok"], kernel_probe["invalid_ordinal"]["error"]


@pytest.mark.cuda
def test_device_side_assert_is_captured(helpers: Path) -> None:
    got = probe(helpers, "assert_async", dict(os.environ))
    assert got["raised"], f"torch._assert_async(tensor(0, device='cuda')) did not raise a RuntimeError: {got}"
    assert "CUDA" in got["message"], got["message"]
