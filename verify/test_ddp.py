"""Area 5, DDP launch: torchrun starts workers with the documented environment, DDP keeps them in sync,
and a failing worker makes torchrun exit non-zero with the root cause, in bounded time.

gloo on CPU always; NCCL on GPUs when present. Every run has a timeout and its whole process group is
killed past it, so no check can hang (torchrun's workers included).
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest
import torch

from torchkiln.verify import proc

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(300)]
TORCHRUN_TIMEOUT = 120.0
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def _runs_distributed() -> None:
    if not torch.distributed.is_available():
        pytest.fail("torch.distributed is not available: the build has USE_DISTRIBUTED=0", pytrace=False)


def read_ranks(out: Path, world: int, result: proc.Result) -> list[dict]:
    files = sorted(out.glob("rank*.json"))
    assert len(files) == world, (
        f"expected {world} rank reports, found {[f.name for f in files]}\n{result.describe()}"
    )
    return [json.loads(f.read_text()) for f in files]


def standalone_argv(helpers: Path, nproc: int) -> list[str]:
    return [*TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", str(helpers / "ddp_check.py")]


def two_node_argv(helpers: Path, run_id: str) -> list[str]:
    """One of two torchrun agents on loopback as two nodes: c10d, fixed --nnodes=2 (no last-call wait)."""
    return [
        *TORCHRUN,
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{proc.free_port()}",
        f"--rdzv-id={run_id}",
        str(helpers / "ddp_check.py"),
    ]


@pytest.fixture(scope="module")
def module_env() -> dict[str, str]:
    import os

    from torchkiln.verify.proc import worker_environment

    return worker_environment(os.environ)  # the suite's policy: no caller's TORCH_DISTRIBUTED_DEBUG, ...


@pytest.fixture(scope="module")
def gloo_launches(
    helpers: Path, module_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> dict:
    """The three CPU launches, started at once (torchrun idles while it rendezvous and monitors; running
    them side by side roughly halves the wall time on two cores): standalone 2 workers, two agents as two
    nodes, and standalone with rank 1 raising. Results are checked by the tests, not here."""
    _runs_distributed()
    dirs = {name: tmp_path_factory.mktemp(f"ddp-{name}") for name in ("standalone", "two_nodes", "failure")}
    run_id = f"verify-{uuid.uuid4().hex[:12]}"
    two_node = two_node_argv(helpers, run_id)

    def env(name: str, **extra: str) -> dict[str, str]:
        return {**module_env, "DDP_OUT_DIR": str(dirs[name]), "DDP_BACKEND": "gloo", **extra}

    started = {
        "standalone": [proc.start(standalone_argv(helpers, 2), env=env("standalone"))],
        "two_nodes": [proc.start(two_node, env=env("two_nodes")) for _ in range(2)],
        "failure": [proc.start(standalone_argv(helpers, 2), env=env("failure", FAIL_RANK="1"))],
    }
    results = {name: [proc.wait(p, TORCHRUN_TIMEOUT) for p in procs] for name, procs in started.items()}
    return {"results": results, "dirs": dirs, "run_id": run_id}


def _succeeded(launches: dict, name: str, what: str) -> tuple[list[proc.Result], list[dict]]:
    results = launches["results"][name]
    for r in results:
        assert not r.timed_out, f"{what} hung: {r.describe()}"
        assert r.returncode == 0, r.describe()
    return results, read_ranks(launches["dirs"][name], 2, results[0])


@pytest.fixture(scope="module")
def gloo_standalone(gloo_launches: dict) -> tuple:
    results, ranks = _succeeded(gloo_launches, "standalone", "torchrun --standalone")
    return results[0], ranks


@pytest.fixture(scope="module")
def gloo_two_nodes(gloo_launches: dict) -> tuple:
    results, ranks = _succeeded(gloo_launches, "two_nodes", "two-node torchrun")
    return results, ranks, gloo_launches["run_id"]


def test_standalone_params_identical_across_ranks(gloo_standalone: tuple) -> None:
    _, ranks = gloo_standalone
    assert all(r["params_identical_across_ranks"] for r in ranks)
    assert len({r["param_sha256"] for r in ranks}) == 1
    assert {r["backend"] for r in ranks} == {"gloo"}


def test_standalone_worker_environment(gloo_standalone: tuple) -> None:
    _, ranks = gloo_standalone
    envs = [r["env"] for r in ranks]
    assert sorted(int(e["RANK"]) for e in envs) == [0, 1]
    for e in envs:
        assert e["LOCAL_RANK"] == e["RANK"], e  # one node: local rank is the global rank
        assert (e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["GROUP_RANK"], e["GROUP_WORLD_SIZE"]) == (
            "2",
            "2",
            "0",
            "1",
        )
        assert e["MASTER_ADDR"], e
        assert e["MASTER_PORT"] and 0 < int(e["MASTER_PORT"]) < 65536, e
        assert e["TORCHELASTIC_RESTART_COUNT"] == "0", e
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"], e["TORCHELASTIC_RUN_ID"]) for e in envs}) == 1


def test_two_nodes_c10d(gloo_two_nodes: tuple) -> None:
    _, ranks, run_id = gloo_two_nodes
    assert all(r["params_identical_across_ranks"] for r in ranks)
    assert len({r["param_sha256"] for r in ranks}) == 1
    envs = [r["env"] for r in ranks]
    assert sorted(int(e["RANK"]) for e in envs) == [0, 1]
    assert sorted(int(e["GROUP_RANK"]) for e in envs) == [0, 1]
    for e in envs:
        assert (e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["LOCAL_RANK"], e["GROUP_WORLD_SIZE"]) == (
            "2",
            "1",
            "0",
            "2",
        )
        assert e["TORCHELASTIC_RUN_ID"] == run_id
        assert e["MASTER_ADDR"] and int(e["MASTER_PORT"]) > 0, e


def test_training_identical_across_launch_topologies(gloo_standalone: tuple, gloo_two_nodes: tuple) -> None:
    """Same seeds, same thread count, gloo: 1 node x 2 workers and 2 nodes x 1 worker agree bitwise."""
    assert gloo_standalone[1][0]["param_sha256"] == gloo_two_nodes[1][0]["param_sha256"]


def test_failing_worker_reports_root_cause(gloo_launches: dict) -> None:
    (result,) = gloo_launches["results"]["failure"]
    assert not result.timed_out, f"torchrun did not exit after a worker failed: {result.describe()}"
    assert result.returncode != 0, result.describe()
    out = result.output
    assert "ChildFailedError" in out and "Root Cause (first observed failure)" in out, result.describe()
    root = out[out.index("Root Cause (first observed failure)") :]
    assert "rank      : 1" in root and "injected failure on rank 1" in root, result.describe()
    assert not list(gloo_launches["dirs"]["failure"].glob("rank*.json")), (
        "a worker finished although rank 1 failed"
    )


@pytest.mark.cuda
def test_nccl_standalone(helpers: Path, module_env: dict[str, str], tmp_path: Path) -> None:
    _runs_distributed()
    if not torch.distributed.is_nccl_available():
        pytest.fail("CUDA build without NCCL: torch.distributed.is_nccl_available() is False", pytrace=False)
    nproc = min(2, torch.cuda.device_count())  # NCCL needs one device per rank
    env = {**module_env, "DDP_OUT_DIR": str(tmp_path), "DDP_BACKEND": "nccl"}
    result = proc.run(standalone_argv(helpers, nproc), timeout=TORCHRUN_TIMEOUT, env=env)
    assert not result.timed_out, f"NCCL DDP hung: {result.describe()}"
    assert result.returncode == 0, result.describe()
    ranks = read_ranks(tmp_path, nproc, result)
    assert {r["backend"] for r in ranks} == {"nccl"}
    assert all(r["params_identical_across_ranks"] for r in ranks)
    assert len({r["param_sha256"] for r in ranks}) == 1
    assert sorted(int(r["env"]["LOCAL_RANK"]) for r in ranks) == list(range(nproc))
