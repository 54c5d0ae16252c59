"""Area 6, reproducibility: the same seeds give bitwise-identical training in separate processes.

Two fresh processes with the same seed, thread count and environment (a DataLoader with 2 workers seeded
through ``generator`` and ``worker_init_fn``, dropout, Adam) must produce identical batch and parameter
hashes; a different seed must not. On CUDA the same holds with deterministic settings. In-process, the
RNG state APIs replay exactly.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from torchkiln.verify import proc

pytestmark = [pytest.mark.reproducibility, pytest.mark.timeout(300)]
RUN_TIMEOUT = 120.0
WORKERS, THREADS = 2, 1  # 3 runs at once on 2 cores: one thread each avoids oversubscription


def concurrent_runs(helpers: Path, env: dict[str, str], runs: list[tuple[int, str]]) -> list[dict]:
    """Start every (seed, device) run at once (separate processes, same environment), then collect them."""
    started = [
        proc.start(
            [sys.executable, str(helpers / "repro_train.py"), str(seed), str(WORKERS), device, str(THREADS)],
            env=env,
        )
        for seed, device in runs
    ]
    results = [proc.wait(p, RUN_TIMEOUT) for p in started]
    out = []
    for r in results:
        assert not r.timed_out, f"training run hung: {r.describe()}"
        assert r.returncode == 0, r.describe()
        out.append(json.loads(r.stdout.strip().splitlines()[-1]))
    return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_same_seed_same_bits_across_processes(helpers: Path, child_env: dict[str, str], device: str) -> None:
    env = {**child_env, "OMP_NUM_THREADS": str(THREADS), "MKL_NUM_THREADS": str(THREADS)}
    first, second, other = concurrent_runs(helpers, env, [(0, device), (0, device), (1, device)])
    assert first["threads"] == THREADS
    assert first["batch_sha256"] == second["batch_sha256"], "same seed, different data from the DataLoader"
    assert first["param_sha256"] == second["param_sha256"], "same seed, different trained parameters"
    assert other["batch_sha256"] != first["batch_sha256"], "a different seed gave the same data"
    assert other["param_sha256"] != first["param_sha256"], "a different seed gave the same parameters"


def test_cpu_rng_state_replays() -> None:
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = torch.randn(100)
    torch.set_rng_state(state)
    assert torch.equal(a, torch.randn(100))
    assert torch.initial_seed() == 123


def test_generator_is_independent_of_global_stream() -> None:
    g = torch.Generator().manual_seed(5)
    saved = g.get_state()
    torch.manual_seed(0)
    expected_global = torch.randn(10)
    torch.manual_seed(0)
    drawn = torch.randn(10, generator=g)
    assert torch.equal(torch.randn(10), expected_global), "a private generator advanced the global stream"
    g.set_state(saved)
    assert torch.equal(torch.randn(10, generator=g), drawn)


def test_fork_rng_isolates_the_global_stream() -> None:
    torch.manual_seed(42)
    expected = torch.randn(10)
    torch.manual_seed(42)
    with torch.random.fork_rng(devices=[]):
        torch.randn(1000)
    assert torch.equal(torch.randn(10), expected)


@pytest.mark.cuda
def test_cuda_rng_state_replays() -> None:
    torch.cuda.manual_seed_all(7)
    state = torch.cuda.get_rng_state()
    a = torch.randn(1000, device="cuda")
    torch.cuda.set_rng_state(state)
    assert torch.equal(a, torch.randn(1000, device="cuda"))
