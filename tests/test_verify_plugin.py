"""The suite's pytest plugin (verify/conftest.py) on a small synthetic suite: one outcome per test over
setup/call/teardown, skip reasons, --require-cuda, area markers enforced, junit.xml moved into place."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from kit import ROOT
from kit.imagekit import need_torch

torch = need_torch()  # the suite runs torch: skipped without it (failed under CI=true)
# The synthetic CUDA test is skipped (or failed under --require-cuda) only where no CUDA device is usable.
no_cuda = pytest.mark.skipif(
    torch.cuda.is_available(), reason="expects a machine without a usable CUDA device"
)

SYNTHETIC = """
import pytest

pytestmark = pytest.mark.amp


@pytest.fixture
def broken():
    raise RuntimeError("fixture broke")


@pytest.fixture
def bad_teardown():
    yield
    raise RuntimeError("teardown broke")


def test_ok():
    pass


def test_fail():
    assert 1 == 2, "boom"


def test_setup_error(broken):
    pass


def test_teardown_error(bad_teardown):
    pass


@pytest.mark.cuda
def test_needs_cuda():
    pass


def test_skipped():
    pytest.skip("not today")


@pytest.mark.ddp
@pytest.mark.amp
def test_two_areas_is_rejected_elsewhere():
    pass
"""


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    directory = tmp_path / "suite"
    directory.mkdir()
    shutil.copy(ROOT / "verify" / "conftest.py", directory / "conftest.py")
    shutil.copy(ROOT / "verify" / "pytest.ini", directory / "pytest.ini")
    (directory / "test_synthetic.py").write_text(SYNTHETIC)
    return directory


def run(suite: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", str(suite), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=suite.parent,
        env=env,
    )


def test_two_area_markers_are_a_usage_error(suite: Path) -> None:
    result = run(suite)
    assert result.returncode == 4
    assert "needs exactly one area marker" in result.stdout + result.stderr


@no_cuda
def test_outcomes_per_test_and_report_files(suite: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = run(suite, "--report", str(out), "-k", "not two_areas")
    assert result.returncode == 1, result.stdout + result.stderr
    summary = json.loads((out / "summary.json").read_text())
    # the CUDA check's skip: on a CPU build "not this kind of build" (not "no GPU"); on a CUDA build (PyPI's
    # torch==2.13.0 is upstream's CUDA 13.0 build) with no usable device, "no GPU"; pytest.skip("not today")
    # is other
    cuda_build = torch.version.cuda is not None
    assert summary["areas"]["amp"] == {"passed": 1, "failed": 1, "skipped": 2, "error": 2} | {
        "skipped_no_gpu": int(cuda_build),
        "skipped_not_applicable": int(not cuda_build),
        "skipped_other": 1,
    }
    by_test = {f["nodeid"].split("::")[-1]: f for f in summary["failures"] + summary["skips"]}
    assert by_test["test_fail"]["message"].startswith("AssertionError: boom")
    assert (
        by_test["test_setup_error"]["outcome"] == "error"
        and "fixture broke" in by_test["test_setup_error"]["message"]
    )
    assert by_test["test_teardown_error"]["outcome"] == "error"
    assert by_test["test_skipped"]["message"] == "not today"
    needs_cuda = by_test["test_needs_cuda"]["message"]
    assert needs_cuda.startswith("needs CUDA")
    assert ("built without CUDA" in needs_cuda, "no device is usable" in needs_cuda) == (
        not cuda_build,
        cuda_build,
    ), needs_cuda
    root = ET.parse(out / "junit.xml").getroot()
    suite_el = root if root.tag == "testsuite" else root.find("testsuite")
    assert int(suite_el.get("failures")) == 1 and int(suite_el.get("skipped")) == 2
    assert sorted(p.name for p in out.iterdir()) == ["junit.xml", "summary.json", "summary.md"]


@no_cuda
def test_require_cuda_fails_the_cuda_test_only(suite: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = run(suite, "--report", str(out), "--require-cuda", "-k", "needs_cuda or skipped or ok")
    assert result.returncode == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["areas"]["amp"] == {"passed": 1, "failed": 1, "skipped": 1, "error": 0} | {
        "skipped_no_gpu": 0,
        "skipped_not_applicable": 0,
        "skipped_other": 1,
    }
    (failure,) = summary["failures"]
    assert failure["nodeid"].endswith("test_needs_cuda")
    assert failure["message"].startswith(
        "CUDA is required (--require-cuda was given): this CUDA check could not run: needs CUDA"
    )
    assert summary["options"]["require_cuda_reason"] == "--require-cuda was given"


GPU_HOST = ROOT / "tests" / "data" / "gpu_host"  # an nvidia-smi that lists one H100 (its header says why)


def test_a_gpu_host_requires_cuda_of_a_cuda_build_only(suite: Path, tmp_path: Path) -> None:
    """On a machine with an NVIDIA GPU (here: nvidia-smi on PATH lists one), CUDA is required exactly when
    torch is a CUDA build, and the header and the report say why. With a CPU build (this venv's) the CUDA
    check is not applicable; with a CUDA build whose CUDA cannot start, it fails naming torch's reason."""
    out = tmp_path / "report"
    env = {**os.environ, "PATH": f"{GPU_HOST}{os.pathsep}{os.environ['PATH']}"}
    result = run(suite, "--report", str(out), "-k", "needs_cuda", env=env)
    summary = json.loads((out / "summary.json").read_text())
    if torch.version.cuda is None:
        assert result.returncode == 0, result.stdout + result.stderr
        assert "require-cuda: no (torch is not a CUDA build)" in result.stdout
        assert summary["options"]["require_cuda"] is False
        (skip,) = summary["skips"]
        assert skip["kind"] == "not_applicable"
        return
    reason = "this machine has an NVIDIA GPU (nvidia-smi -L lists GPU 0: NVIDIA H100 80GB HBM3)"
    assert f"require-cuda: yes ({reason}" in result.stdout
    assert summary["options"]["require_cuda"] is True and summary["options"][
        "require_cuda_reason"
    ].startswith(reason)
    if not torch.cuda.is_available():
        assert result.returncode == 1, result.stdout + result.stderr
        (failure,) = summary["failures"]
        assert (
            failure["message"].startswith(f"CUDA is required ({reason}")
            and "torch.cuda.init(): " in failure["message"]
        )
