"""What the verification suite controls in its processes' environment (issue 14 item 12), and where it writes
(issue 46)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from imagekit import need_torch, require

from torchkiln.verify.proc import (
    SCRATCH_DIRS,
    SCRATCH_ENV,
    WORKER_SET,
    scratch_environment,
    worker_environment,
)

ROOT = Path(__file__).resolve().parents[1]


def test_debug_switches_and_launcher_variables_are_removed_numerics_pinned_the_rest_kept() -> None:
    env = worker_environment(
        {
            "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
            "TORCH_CPP_LOG_LEVEL": "INFO",
            "MASTER_PORT": "1",
            "RANK": "3",
            "TORCHELASTIC_RUN_ID": "x",
            "OMP_NUM_THREADS": "64",
            "CUDA_VISIBLE_DEVICES": "1",
            "GLOO_SOCKET_IFNAME": "eth1",
            "PATH": "/usr/bin",
        }
    )
    assert not {
        "TORCH_DISTRIBUTED_DEBUG",
        "TORCH_CPP_LOG_LEVEL",
        "MASTER_PORT",
        "RANK",
        "TORCHELASTIC_RUN_ID",
    } & set(env)
    assert env["OMP_NUM_THREADS"] == "1" and all(env[k] == v for k, v in WORKER_SET.items())
    assert (
        env["CUDA_VISIBLE_DEVICES"] == "1"
        and env["GLOO_SOCKET_IFNAME"] == "eth1"
        and env["PATH"] == "/usr/bin"
    )


# --- verify writes nothing outside its report directory and its own temp directory (issue 46) -----------------


def _listing(*roots: Path) -> set[str]:
    return {str(p) for root in roots for p in root.rglob("*")}


@pytest.mark.integration
@pytest.mark.parametrize("how", ["torchkiln verify", "pytest"])
def test_torch_compile_writes_nothing_outside_the_report_and_its_temp_directory(
    tmp_path: Path, how: str
) -> None:
    """The real torch.compile check (inductor, C++ on the CPU) with the system temp directory, HOME and the
    suite (a copy, $TORCHKILN_VERIFY_DIR) listed before and after: unchanged, everything under the report
    directory. torch put 120-155 MB of precompiled headers under the temp directory's torchinductor_<user>
    (tempfile.gettempdir(), whatever TORCHINDUCTOR_CACHE_DIR said)."""
    need_torch()
    require(
        shutil.which("g++") is not None or shutil.which("c++") is not None, "no C++ compiler for inductor"
    )
    system_tmp, home, suite, report = (tmp_path / n for n in ("tmp", "home", "suite", "report"))
    system_tmp.mkdir()
    home.mkdir()
    shutil.copytree(ROOT / "verify", suite, ignore=shutil.ignore_patterns("__pycache__"))
    before = _listing(system_tmp, home, suite)
    select = "compiled_function_equals_eager and cpu and float32"
    argv = (
        [
            sys.executable,
            "-m",
            "torchkiln",
            "verify",
            "--area",
            "release",
            "--report",
            str(report),
            "--",
            "-k",
            select,
        ]
        if how == "torchkiln verify"
        else [
            sys.executable,
            "-m",
            "pytest",
            str(suite),
            "-m",
            "release",
            "-k",
            select,
            "--report",
            str(report),
        ]
    )
    environ = {k: v for k, v in os.environ.items() if k not in SCRATCH_DIRS and k != SCRATCH_ENV}
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=900, check=False, cwd=tmp_path,
        env={**environ, "TMPDIR": str(system_tmp), "HOME": str(home), "TORCHKILN_VERIFY_DIR": str(suite)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = json.loads((report / "summary.json").read_text())
    assert summary["totals"]["passed"] == 1, summary["checks"]
    assert _listing(system_tmp, home, suite) == before
    assert sorted(p.name for p in report.iterdir()) == ["junit.xml", "summary.json", "summary.md"]


def test_the_scratch_environment_puts_every_cache_under_its_root(tmp_path: Path) -> None:
    env = scratch_environment(tmp_path / "scratch")
    assert env[SCRATCH_ENV] == str(tmp_path / "scratch") and env["PYTHONDONTWRITEBYTECODE"] == "1"
    for name in SCRATCH_DIRS:
        assert Path(env[name]).is_dir() and Path(env[name]).parent == tmp_path / "scratch", name
    # the suite's policy keeps them for every process it starts
    assert {k: worker_environment(env)[k] for k in env} == env
