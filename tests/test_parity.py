"""``torchkiln verify --compare-with``: the battery, the comparison and its tolerances, the command's input.

The comparison is tested on battery documents made here (every status: identical, within, outside, an
operation this build cannot run), the battery on the installed torch in fresh processes: twice the same
bytes, and a process that flushes denormals to zero (a sitecustomize hook: what a build linked with
-ffast-math does to every process) caught on exactly the denormal cases. The whole command against
upstream's real wheels (2.13.0+cu130 against 2.13.0+cpu) runs in the reference tier (tests/reference/).
"""

from __future__ import annotations

import array
import base64
import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kit import ROOT
from kit.imagekit import require
from test_verify_cli import verify

from torchkiln.errors import UsageError
from torchkiln.verify import battery, parity, refenv


def encoded(values: list[float], dtype: str = "float32") -> dict[str, Any]:
    data = array.array("d", values).tobytes()
    return {
        "dtype": dtype,
        "shape": [len(values)],
        "sha256": hashlib.sha256(data).hexdigest(),
        "float64": base64.b64encode(data).decode(),
    }


def document(cases: dict[str, Any]) -> dict[str, Any]:
    return {"format": battery.FORMAT, "torch": {"version": "2.13.0"}, "inputs_sha256": "x", "cases": cases}


ROWS = parity.tolerances()


def test_every_battery_case_has_a_tolerance_and_the_most_specific_row_wins() -> None:
    for case in battery.CASES:
        for device, dtypes in {
            "cpu": ["float32", "bfloat16", "float16"],
            "cuda": ["float32", "float16"],
        }.items():
            for dtype in dtypes:
                assert parity.tolerance_for(f"{case}/{device}/{dtype}", ROWS).why
    assert parity.tolerance_for("matmul/cpu/float32", ROWS).rtol == 1.3e-6  # the dtype row
    assert parity.tolerance_for("model/cpu/float32", ROWS).rtol == 1e-5  # case + dtype beats dtype
    exact = parity.tolerance_for("denormals/cpu/float32", ROWS)  # case alone beats dtype alone
    assert (exact.rtol, exact.atol) == (0.0, 0.0)
    tf32 = parity.tolerance_for("conv2d/cuda/float32", ROWS)
    assert tf32.rtol == 2e-3 and "TF32" in tf32.why
    assert parity.tolerance_for("conv2d/cpu/float32", ROWS).rtol == 1.3e-6


def test_identical_within_and_outside_tolerance() -> None:
    upstream = document(
        {
            "matmul/cpu/float32": {"outputs": {"out": encoded([1.0, 2.0, -3.0])}},
            "softmax/cpu/float32": {
                "outputs": {"softmax": encoded([0.5, 0.25]), "log_softmax": encoded([1.0])}
            },
            "norms/cpu/float32": {"outputs": {"layer_norm": encoded([10.0, 0.0])}},
        }
    )
    mine = copy.deepcopy(upstream)
    mine["cases"]["softmax/cpu/float32"]["outputs"]["softmax"] = encoded([0.5 + 1e-7, 0.25])  # within
    mine["cases"]["norms/cpu/float32"]["outputs"]["layer_norm"] = encoded([10.001, 0.0])  # rel 1e-4
    by_name = {(o.case, o.output): o for o in parity.compare(mine, upstream, ROWS)}
    assert by_name[("matmul/cpu/float32", "out")].status == "identical"
    assert by_name[("softmax/cpu/float32", "log_softmax")].status == "identical"
    within = by_name[("softmax/cpu/float32", "softmax")]
    assert within.status == "within" and within.ok and within.max_abs == pytest.approx(1e-7)
    outside = by_name[("norms/cpu/float32", "layer_norm")]
    assert outside.status == "differs" and not outside.ok
    assert outside.max_abs == pytest.approx(1e-3) and outside.max_rel == pytest.approx(1e-4)
    assert outside.describe() == (
        "norms/cpu/float32 layer_norm: max abs 0.001, max rel 0.0001 (outside rtol 1.3e-06, atol 1e-05): "
        "1 of 2 elements outside"
    )


def test_nan_and_an_operation_this_build_cannot_run() -> None:
    upstream = document(
        {
            "attention/cpu/float16": {"outputs": {"out": encoded([1.0, float("nan")], "float16")}},
            "conv2d/cpu/float16": {"outputs": {"out": encoded([1.0], "float16")}},
            "matmul/cpu/float16": {"unsupported": "RuntimeError: not implemented for 'Half'"},
        }
    )
    mine = copy.deepcopy(upstream)
    mine["cases"]["attention/cpu/float16"]["outputs"]["out"] = encoded(
        [float("nan"), float("nan")], "float16"
    )
    mine["cases"]["conv2d/cpu/float16"] = {
        "unsupported": "RuntimeError: \"slow_conv2d\" not implemented for 'Half'"
    }
    results = {o.case: o for o in parity.compare(mine, upstream, ROWS)}
    assert results["attention/cpu/float16"].status == "differs"  # a NaN where upstream has 1.0
    assert results["conv2d/cpu/float16"].status == "missing"
    assert "upstream runs it, this build: RuntimeError" in results["conv2d/cpu/float16"].describe()
    assert "matmul/cpu/float16" not in results  # neither side runs it: nothing to compare


def test_a_file_that_is_not_a_battery_result_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text('{"format": 99}')
    with pytest.raises(UsageError, match=r"--parity-reference .*x.json: not a parity battery result"):
        parity.load(bad, "--parity-reference")


def run_battery(tmp_path: Path, name: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    out = tmp_path / f"{name}.json"
    subprocess.run(
        [sys.executable, battery.__file__, "--out", str(out)],
        check=True,
        capture_output=True,
        env=env,
        timeout=300,
    )
    return json.loads(out.read_text())


@pytest.mark.integration
def test_the_battery_repeats_bitwise_and_a_process_flushing_denormals_is_caught(tmp_path: Path) -> None:
    first, second = run_battery(tmp_path, "first"), run_battery(tmp_path, "second")
    assert set(first["cases"]) == {
        f"{c}/cpu/{d}" for c in battery.CASES for d in ("float32", "bfloat16", "float16")
    }
    assert first["torch"]["threads"] == 1
    assert {o.status for o in parity.compare(second, first, ROWS)} == {"identical"}
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text("import torch\ntorch.set_flush_denormal(True)\n")
    flushed = run_battery(tmp_path, "flushed", env={**os.environ, "PYTHONPATH": str(hook)})
    outputs = parity.compare(flushed, first, ROWS)
    wrong = sorted(f"{o.case} {o.output}" for o in outputs if not o.ok)
    # float16's subnormals are normal numbers in float32, where the CPU computes them: not flushed
    assert wrong == [f"denormals/cpu/{d} {o}" for d in ("bfloat16", "float32") for o in ("half", "triple")]
    assert all(o.status == "identical" for o in outputs if not o.case.startswith("denormals/"))


def test_the_parity_area_needs_compare_with() -> None:
    result = verify("--area", "parity")
    assert result.returncode == 2
    assert "--area parity needs --compare-with REQ" in result.stderr and "Traceback" not in result.stderr


def test_compare_with_a_missing_wheel_file_is_a_usage_error(tmp_path: Path) -> None:
    result = verify("--area", "parity", "--compare-with", str(tmp_path / "torch-9.9-cp311-none-any.whl"))
    assert result.returncode == 2
    assert "no such wheel file (valid: a requirement or a .whl)" in result.stderr


@pytest.mark.integration
def test_compare_with_what_pip_cannot_install_is_a_usage_error(tmp_path: Path) -> None:
    wheel = tmp_path / "torch-0.0.1-py3-none-any.whl"
    wheel.write_bytes(b"not a zip")
    env = {**os.environ, refenv.CACHE_ENV: str(tmp_path / "cache")}
    result = verify("--area", "parity", "--compare-with", str(wheel), env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"--compare-with {wheel}: pip cannot install it: "), result.stderr
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []  # nothing half-made is kept


def test_release_notice_compares_releases_not_local_labels() -> None:
    assert parity.release_notice("2.13.0+cu130", "2.13.0+cpu") is None
    notice = parity.release_notice("2.8.0+cu128", "2.10.0+cu128")
    assert notice is not None and notice.startswith(
        "the reference is another release: torch 2.10.0 (2.10.0+cu128)"
    )
    assert "this build torch 2.8.0 (2.8.0+cu128)" in notice


def _moved(result: dict[str, Any], case: str) -> dict[str, Any]:
    """``result`` with every output of ``case`` moved by 1.0 per element: a reference that computes otherwise."""
    import array
    import base64
    import hashlib

    changed = json.loads(json.dumps(result))
    for encoded in changed["cases"][case]["outputs"].values():
        values = array.array("d")
        values.frombytes(base64.b64decode(encoded["float64"]))
        moved = array.array("d", (v + 1.0 for v in values))
        encoded["float64"] = base64.b64encode(moved.tobytes()).decode()
        encoded["sha256"] = hashlib.sha256(moved.tobytes()).hexdigest()
    return changed


@pytest.mark.integration
def test_a_reference_of_another_release_is_named_in_header_and_summary(tmp_path: Path) -> None:
    """The battery of the installed torch, relabelled as another release's: the header, summary.json,
    summary.md and parity.md each say the reference is another release (and the same file unchanged, that
    it is the same release)."""
    import torch

    result = run_battery(tmp_path, "here")
    other = json.loads(json.dumps(result))
    major, minor, _ = torch.__version__.split("+")[0].split(".")
    other["torch"]["version"] = f"{major}.{int(minor) - 1}.1+cpu"
    # another release that computes otherwise: the failure's own cause names the release (it was null)
    differs = _moved(other, "matmul/cpu/float32")
    for name, data in (("same", result), ("other", other), ("differs", differs)):
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
        out = tmp_path / f"report-{name}"
        run = subprocess.run(
            [sys.executable, "-m", "pytest", str(ROOT / "verify"), "-m", "parity", "-k", "matmul-cpu",
             "--parity-reference", str(tmp_path / f"{name}.json"), "--report", str(out)],
            capture_output=True, text=True, timeout=600, check=False, cwd=tmp_path,
        )  # fmt: skip
        summary = json.loads((out / "summary.json").read_text())
        if name == "differs":
            assert run.returncode == 1, run.stdout[-4000:] + run.stderr[-2000:]
            (failure,) = summary["failures"]
            assert failure["message"].startswith(
                f"torch {torch.__version__} differs from upstream's {data['torch']['version']}: matmul/cpu/float32 "
            ), failure["message"]
            assert failure["cause"].startswith(
                f"the reference is another release: torch {major}.{int(minor) - 1}.1 ({data['torch']['version']}), "
                f"this build torch {torch.__version__.split('+')[0]}"
            ), failure["cause"]
            assert f"| `{failure['cause']}` |" in (out / "summary.md").read_text()
            continue
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
        compared = summary["options"]["compare_with"]
        assert compared["reference_torch"] == data["torch"]["version"]
        if name == "same":
            assert compared == {"reference_torch": torch.__version__, "same_release": True, "notice": None}
            assert f"compare-with: torch {torch.__version__}: the same release" in run.stdout
            continue
        assert compared["same_release"] is False
        assert f"the reference is another release: torch {major}.{int(minor) - 1}.1" in compared["notice"]
        assert (
            f"compare-with: torch {other['torch']['version']}: the reference is another release" in run.stdout
        )
        assert (
            "**Compared with another release**: the reference is another release"
            in (out / "summary.md").read_text()
        )
        assert "**Another release**: the reference is another release" in (out / "parity.md").read_text()


def _base_prefix(python: str) -> str | None:
    """The installation ``python`` belongs to (None: it does not run, as a pyenv shim of no selected version)."""
    code = "import os, sys; print(os.path.realpath(sys.base_prefix))"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def test_venvs_of_one_python_installation_share_the_reference_venv(tmp_path: Path) -> None:
    """The reference venv's cache entry is the Python installation's, not the venv's (the tests' venv, each nox
    session's and a user's several venvs would each hold a copy of upstream's CUDA wheels); another
    installation or another requirement is another entry."""
    made = []
    for name in ("a", "b"):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / name)], check=True)
        made.append(str(tmp_path / name / "bin" / "python"))
    keys = {refenv._key("torch===2.13.0", python) for python in (*made, sys.executable)}
    assert len(keys) == 1
    assert refenv._key("torch==2.13.0", made[0]) not in keys
    found = [shutil.which(f"python3.{minor}") for minor in range(10, 15)] + ["/usr/bin/python3"]
    here = _base_prefix(sys.executable)
    others = [p for p in found if p and Path(p).is_file() and _base_prefix(p) not in (None, here)]
    require(bool(others), "no second Python installation on this machine (Debian's /usr/bin/python3 is one)")
    assert refenv._key("torch===2.13.0", others[0]) not in keys
