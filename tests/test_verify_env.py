"""What the verification suite controls in its processes' environment (issue 14 item 12), and where it writes
(issue 46)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from multiprocessing.connection import Listener
from pathlib import Path

import pytest
from kit import ROOT
from kit.imagekit import need_torch, require

from torchkiln.verify.proc import (
    SCRATCH_DIRS,
    SCRATCH_ENV,
    SOCKET_ROOM,
    UNIX_PATH_MAX,
    WORKER_SET,
    scratch_environment,
    scratch_parent,
    worker_environment,
)


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


def test_the_scratch_environment_puts_every_cache_under_its_root() -> None:
    # made where `torchkiln verify` makes it: pytest's tmp_path can leave no room for a socket under it
    # (as a user named newcomer: /tmp/pytest-of-newcomer/pytest-N/<test>/scratch/tmp, 109 bytes with one)
    parent = Path(tempfile.mkdtemp(prefix=PREFIX, dir=scratch_parent(PREFIX)))
    try:
        env = scratch_environment(parent / "scratch")
        assert env[SCRATCH_ENV] == str(parent / "scratch") and env["PYTHONDONTWRITEBYTECODE"] == "1"
        for name in SCRATCH_DIRS:
            assert Path(env[name]).is_dir() and Path(env[name]).parent == parent / "scratch", name
        # the suite's policy keeps them for every process it starts
        assert {k: worker_environment(env)[k] for k in env} == env
    finally:
        shutil.rmtree(parent)


PREFIX = "torchkiln-verify-"
# a process of the suite: a DataLoader whose 2 workers hand their batches over (file descriptors through
# multiprocessing's resource sharer, a Unix socket under TMPDIR)
LOADER = """
import torch
from torch.utils.data import DataLoader, TensorDataset
loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=8, num_workers=2)
print(sum(float(b[0].sum()) for b in loader))
"""


def _deep(base: Path, length: int) -> Path:
    """A directory under ``base`` whose path is ``length`` bytes long (made); ``base`` itself where it is that
    long or longer already (a long pytest base directory)."""
    path, left = base, length - len(str(base))
    if left < 2:
        return base
    while left > 0:
        part = min(40, left - 1) if left - 1 - min(40, left - 1) != 1 else 38  # never one byte left over
        path, left = path / ("d" * part), left - part - 1
    path.mkdir(parents=True, exist_ok=True)
    assert len(str(path)) == length, path
    return path


@pytest.mark.parametrize("extra", [2, 10, 20, 30, 40, 60, 90])
def test_the_suites_temp_directory_leaves_room_for_a_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: int
) -> None:
    """Whatever the system temp directory's length (CI's nox gives .nox/<session>/tmp), the suite's TMPDIR
    is one under which multiprocessing binds its listener socket: real binds, by the table of lengths around
    the limit; the system temp directory is kept wherever the socket fits under it."""
    system = _deep(tmp_path, len(str(tmp_path)) + extra)
    monkeypatch.setattr(tempfile, "tempdir", str(system))
    parent = scratch_parent(PREFIX)
    fits = len(str(system)) + len(f"/{PREFIX}xxxxxxxx/suite/tmp") + SOCKET_ROOM <= UNIX_PATH_MAX
    assert parent == (str(system) if fits else "/tmp")
    scratch = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
    try:
        env = scratch_environment(scratch / "suite")
        # multiprocessing's own names (CPython's util.get_temp_dir and connection.arbitrary_address)
        where = Path(tempfile.mkdtemp(prefix="pymp-", dir=env["TMPDIR"]))
        with Listener(address=tempfile.mktemp(prefix="listener-", dir=where), family="AF_UNIX") as listener:
            assert Path(listener.address).parent == where
    finally:
        shutil.rmtree(scratch)


def test_a_temp_directory_with_no_room_for_a_socket_is_refused_by_name(tmp_path: Path) -> None:
    root = _deep(tmp_path, max(UNIX_PATH_MAX - SOCKET_ROOM + 1 - len("/tmp"), len(str(tmp_path)) + 2))
    with pytest.raises(ValueError, match=r"too long for a temp directory"):
        scratch_environment(root)
    assert not (root / "tmp").exists()
    with pytest.raises(OSError, match="too long"):  # what the suite's processes would have met
        Listener(address=str(root / "tmp" / "pymp-xxxxxxxx" / "listener-xxxxxxxx"), family="AF_UNIX")


@pytest.mark.integration
def test_a_dataloaders_workers_hand_over_their_batches_under_a_long_system_temp_directory(
    tmp_path: Path,
) -> None:
    """The reproducibility area's DataLoader under `torchkiln verify`'s environment when the system temp
    directory is too long for a socket (CI's nox session): it finishes (it waited forever before)."""
    need_torch()
    system = _deep(tmp_path, 100)
    environ = {k: v for k, v in os.environ.items() if k not in SCRATCH_DIRS and k != SCRATCH_ENV}
    script = (
        "import os, sys, tempfile\n"
        "from pathlib import Path\n"
        "from torchkiln.verify.proc import scratch_environment, scratch_parent\n"
        f"scratch = Path(tempfile.mkdtemp(prefix={PREFIX!r}, dir=scratch_parent({PREFIX!r})))\n"
        "env = {**os.environ, **scratch_environment(scratch / 'suite')}\n"
        f"os.execve(sys.executable, [sys.executable, '-c', {LOADER!r}], env)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env={**environ, "TMPDIR": str(system)},
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["2016.0"]
