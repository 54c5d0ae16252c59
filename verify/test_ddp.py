"""Area 5, DDP launch: torchrun starts workers with the documented environment, DDP keeps them in sync,
and a failing worker makes torchrun exit non-zero with the root cause, in bounded time.

gloo on CPU always; NCCL on GPUs when present. The launches that run together share one deadline
(``$TORCHKILN_VERIFY_DDP_TIMEOUT``, 120 s): past it each unfinished one is killed with its workers and its
checks fail as hung, with the launcher's last lines and the likely cause (:mod:`torchkiln.verify.hang`:
a hostname that does not resolve, a ``*_SOCKET_IFNAME`` naming a missing interface, a loopback that does
not answer, a rendezvous port another process holds; else the ranks' first error line), well inside the
per-test limit, so a DDP problem is reported by the suite and never by pytest-timeout.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from torchkiln.verify import hang, proc

DEADLINE_S = hang.launch_deadline(os.environ)  # a bad value is a usage error before collection (conftest.py)
# pytest-timeout is the last resort only: the deadline, the kill, and the diagnosis fit well inside it.
pytestmark = [pytest.mark.ddp, pytest.mark.timeout(DEADLINE_S + 180)]
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


def two_node_argv(helpers: Path, run_id: str, port: int) -> list[str]:
    """One of two torchrun agents on loopback as two nodes: c10d, fixed --nnodes=2 (no last-call wait)."""
    return [
        *TORCHRUN,
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={ENDPOINT_HOST}:{port}",
        f"--rdzv-id={run_id}",
        str(helpers / "ddp_check.py"),
    ]


ENDPOINT_HOST = "127.0.0.1"
# the two-node launch's rendezvous port: $TORCHKILN_VERIFY_DDP_PORT, else a free one (checked by conftest.py)
PORT = hang.launch_port(os.environ)


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
    port = PORT or proc.free_port()
    two_node = two_node_argv(helpers, run_id, port)

    def env(name: str, **extra: str) -> dict[str, str]:
        return {**module_env, "DDP_OUT_DIR": str(dirs[name]), "DDP_BACKEND": "gloo", **extra}

    started = {
        "standalone": [proc.start(standalone_argv(helpers, 2), env=env("standalone"))],
        "two_nodes": [proc.start(two_node, env=env("two_nodes")) for _ in range(2)],
        "failure": [proc.start(standalone_argv(helpers, 2), env=env("failure", FAIL_RANK="1"))],
    }
    deadline = time.monotonic() + DEADLINE_S  # one for all: waiting on each in turn must not add up
    results = {
        name: [proc.wait(p, max(0.0, deadline - time.monotonic())) for p in procs]
        for name, procs in started.items()
    }
    endpoints = {"two_nodes": [(ENDPOINT_HOST, port)]}
    hung = hung_reports(results, module_env, endpoints)
    return {"results": results, "dirs": dirs, "run_id": run_id, "hung": hung}


WHAT = {
    "standalone": "torchrun --standalone",
    "two_nodes": "two-node torchrun",
    "failure": "torchrun with a failing worker",
}


def hung_reports(
    results: dict[str, list[proc.Result]], env: dict[str, str], endpoints: dict[str, list[tuple[str, int]]]
) -> dict[str, str]:
    """For each launch that did not finish by the deadline, the report its checks fail with: the machine's
    likely causes (looked for once), the rendezvous endpoints of that launch another process holds, the
    first error line of its ranks."""
    hung = {name: rs for name, rs in results.items() if any(r.timed_out for r in rs)}
    if not hung:
        return {}
    causes = hang.likely_causes(env)
    return {
        name: hang.report(
            WHAT.get(name, name),
            "\n".join(r.stdout for r in rs),
            "\n".join(r.stderr for r in rs),
            DEADLINE_S,
            causes + hang.endpoint_problems(endpoints.get(name, [])),
        )
        for name, rs in hung.items()
    }


def _succeeded(launches: dict, name: str) -> tuple[list[proc.Result], list[dict]]:
    if name in launches["hung"]:
        pytest.fail(launches["hung"][name], pytrace=False)
    results = launches["results"][name]
    for r in results:
        assert r.returncode == 0, r.describe()
    return results, read_ranks(launches["dirs"][name], 2, results[0])


@pytest.fixture(scope="module")
def gloo_standalone(gloo_launches: dict) -> tuple:
    results, ranks = _succeeded(gloo_launches, "standalone")
    return results[0], ranks


@pytest.fixture(scope="module")
def gloo_two_nodes(gloo_launches: dict) -> tuple:
    results, ranks = _succeeded(gloo_launches, "two_nodes")
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
    if "failure" in gloo_launches["hung"]:
        pytest.fail(gloo_launches["hung"]["failure"], pytrace=False)
    (result,) = gloo_launches["results"]["failure"]
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
    result = proc.run(standalone_argv(helpers, nproc), timeout=DEADLINE_S, env=env)
    if result.timed_out:
        causes = hang.likely_causes(env)
        pytest.fail(
            hang.report("NCCL torchrun", result.stdout, result.stderr, DEADLINE_S, causes), pytrace=False
        )
    assert result.returncode == 0, result.describe()
    ranks = read_ranks(tmp_path, nproc, result)
    assert {r["backend"] for r in ranks} == {"nccl"}
    assert all(r["params_identical_across_ranks"] for r in ranks)
    assert len({r["param_sha256"] for r in ranks}) == 1
    assert sorted(int(r["env"]["LOCAL_RANK"]) for r in ranks) == list(range(nproc))
