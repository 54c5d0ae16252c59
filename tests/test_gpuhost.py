"""Whether a machine has an NVIDIA GPU (torchkiln.verify.gpuhost), asked at the boundary the driver exposes:
device nodes and /proc entries under a root directory made here, nvidia-smi as an executable on disk."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kit import ROOT

from torchkiln.verify import gpuhost

SMI = ROOT / "tests" / "data" / "gpu_host" / "nvidia-smi"  # lists one H100 as `nvidia-smi -L` does


def _script(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_nothing_nvidia_is_no_gpu(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    host = gpuhost.detect(tmp_path, smi=str(tmp_path / "absent"))
    assert not host.found and host.describe() == "no NVIDIA GPU found"


def test_device_nodes_count_only_gpus(tmp_path: Path) -> None:
    """/dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidia-modeset exist with the driver whether or not a GPU
    does; /dev/nvidia<N> is one GPU."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-modeset"):
        (dev / name).touch()
    assert not gpuhost.detect(tmp_path, smi=str(tmp_path / "absent")).found
    (dev / "nvidia0").touch()
    (dev / "nvidia1").touch()
    host = gpuhost.detect(tmp_path, smi=str(tmp_path / "absent"))
    assert host.evidence == ("device nodes /dev/nvidia0, /dev/nvidia1",)


def test_driver_proc_entries_are_gpus(tmp_path: Path) -> None:
    (tmp_path / "proc" / "driver" / "nvidia" / "gpus" / "0000:3b:00.0").mkdir(parents=True)
    host = gpuhost.detect(tmp_path, smi=str(tmp_path / "absent"))
    assert host.evidence == ("the NVIDIA driver lists 0000:3b:00.0 in /proc/driver/nvidia/gpus",)


def test_nvidia_smi_lists_the_gpus(tmp_path: Path) -> None:
    host = gpuhost.detect(tmp_path, smi=str(SMI))
    assert host.evidence == ("nvidia-smi -L lists GPU 0: NVIDIA H100 80GB HBM3",)


def test_a_failing_nvidia_smi_is_no_evidence(tmp_path: Path) -> None:
    """nvidia-smi without a working driver prints its complaint and exits 9: that alone proves no GPU."""
    smi = _script(
        tmp_path / "nvidia-smi",
        "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that "
        'the latest NVIDIA driver is installed and running."\nexit 9',
    )
    assert not gpuhost.detect(tmp_path, smi=smi).found


def test_a_hung_nvidia_smi_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpuhost, "SMI_TIMEOUT_S", 0.5)
    smi = _script(tmp_path / "nvidia-smi", "sleep 60")
    started = time.monotonic()
    assert not gpuhost.detect(tmp_path, smi=smi).found
    assert time.monotonic() - started < 30


@pytest.mark.parametrize(
    ("option", "cuda_build", "gpu", "required", "why"),
    [
        (True, False, False, True, "--require-cuda was given"),
        (False, True, True, False, "--no-require-cuda was given"),
        (None, False, True, False, "torch is not a CUDA build"),
        (None, True, False, False, "no NVIDIA GPU on this machine"),
        (None, True, True, True, "this machine has an NVIDIA GPU (nvidia-smi -L lists GPU 0"),
    ],
)
def test_when_cuda_is_required(
    option: bool | None, cuda_build: bool, gpu: bool, required: bool, why: str
) -> None:
    host = gpuhost.GpuHost(("nvidia-smi -L lists GPU 0: NVIDIA H100 80GB HBM3",) if gpu else ())
    got, reason = gpuhost.require_cuda(option, cuda_build=cuda_build, host=host)
    assert got is required and reason.startswith(why), reason
