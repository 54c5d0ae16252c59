"""``torchkiln verify --compare-with`` on upstream's real wheels (``nox -s reference``, the 2.13 pair).

The reference run verifies upstream's 2.13.0+cu130 with ``--compare-with torch==2.13.0`` (upstream's
2.13.0+cpu, in a cached venv): two real builds of one release, compared on the CPU, must compute the same.
Then the negative control: the same build in a process that flushes denormals to zero (a sitecustomize hook
on PYTHONPATH, which the upstream side's ``python -I`` does not see) must fail, on the denormal cases only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

COMPARE_ENV = "TORCHKILN_REFERENCE_COMPARE"  # set by `nox -s reference` for the pairs it compares
REPORT_ENV = "TORCHKILN_REFERENCE_REPORT"

pytestmark = pytest.mark.skipif(
    not os.environ.get(COMPARE_ENV), reason=f"{COMPARE_ENV} is not set: this pair is not compared"
)


def test_two_real_builds_of_one_release_compute_the_same() -> None:
    report = Path(os.environ[REPORT_ENV])
    summary = json.loads((report / "summary.json").read_text())
    parity = [c for c in summary["checks"] if c["area"] == "parity"]
    ran = {c["nodeid"].split("::")[-1]: c["outcome"] for c in parity}
    assert {n for n, o in ran.items() if n.endswith("-cpu]")} == {
        f"test_computes_what_upstream_computes[{case}-cpu]"
        for case in ("matmul", "conv2d", "norms", "softmax", "attention", "model", "denormals")
    }
    assert {o for n, o in ran.items() if n.endswith("-cpu]")} == {"passed"}, ran
    table = json.loads((report / "parity.json").read_text())
    assert table["verified"]["version"].endswith("+cu130") and table["reference"]["version"].endswith("+cpu")
    assert table["outputs"] and all(o["status"] in ("identical", "within") for o in table["outputs"]), table


def test_a_process_that_flushes_denormals_is_caught(tmp_path: Path) -> None:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text("import torch\ntorch.set_flush_denormal(True)\n")
    out = tmp_path / "report"
    result = subprocess.run(
        [sys.executable, "-m", "torchkiln", "verify", "--area", "parity"]
        + ["--compare-with", os.environ[COMPARE_ENV], "--report", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(hook)},
        timeout=1800,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stdout[-4000:] + result.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    (failure,) = summary["failures"]
    assert failure["nodeid"].endswith("test_computes_what_upstream_computes[denormals-cpu]")
    assert "denormals/cpu/float32 half: max abs" in failure["message"]
    assert "(outside rtol 0, atol 0): 64 of 64 elements outside" in failure["message"]
