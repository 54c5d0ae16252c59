"""A small DDP training run, launched by torchrun from the DDP checks.

Each rank seeds *differently* on purpose, so only DDP's initial broadcast makes the ranks agree, and
feeds different data for a few SGD steps; then the flattened parameters are all-gathered and compared
bitwise. Each rank writes ``rank<N>.json`` into DDP_OUT_DIR with the launcher's environment contract
and a hash of the parameters. ``FAIL_RANK=<n>`` makes that rank raise (the failure-reporting check);
``@record`` writes the error file torchrun reads the root cause from. ``TORCHKILN_VERIFY_HANG_RANK=<n>``
makes that rank sleep instead of joining (torchkiln's tests inject a hung worker with it, so the DDP
launches' deadline and hang report are proven on a real torchrun).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

ENV_KEYS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
)


def param_bytes(model: torch.nn.Module) -> bytes:
    flat = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
    return bytes(flat.contiguous().view(torch.uint8).untyped_storage())


@record
def main() -> None:
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if os.environ.get("FAIL_RANK") == str(rank):
        raise RuntimeError(f"injected failure on rank {rank}")
    if os.environ.get("TORCHKILN_VERIFY_HANG_RANK") == str(rank):
        print(f"rank {rank}: sleeping instead of joining (TORCHKILN_VERIFY_HANG_RANK)", flush=True)
        time.sleep(24 * 3600)
    use_cuda = os.environ.get("DDP_BACKEND") == "nccl"
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if use_cuda else "gloo", device_id=device if use_cuda else None)
    torch.manual_seed(1234 + rank)  # different on purpose: DDP must broadcast rank 0's parameters
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(99 + rank)  # different data per rank
    for _ in range(5):
        x, y = torch.randn(8, 16, generator=data).to(device), torch.randn(8, 4, generator=data).to(device)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    identical = all(torch.equal(gathered[0], g) for g in gathered)
    out = Path(os.environ["DDP_OUT_DIR"])
    record_ = {
        "env": {k: os.environ.get(k) for k in ENV_KEYS},
        "backend": dist.get_backend(),
        "params_identical_across_ranks": identical,
        "param_sha256": hashlib.sha256(param_bytes(model)).hexdigest(),
    }
    tmp = out / f".rank{rank}.json.tmp"
    tmp.write_text(json.dumps(record_))
    os.replace(tmp, out / f"rank{rank}.json")
    dist.barrier()
    dist.destroy_process_group()
    if not identical:
        sys.exit(f"rank {rank}: parameters differ across ranks after DDP training")


if __name__ == "__main__":
    main()
