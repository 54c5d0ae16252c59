"""A seeded training run in a fresh process; prints the sha256 of every batch it saw and of the final
parameters as JSON. Run twice with the same arguments and environment, the hashes must be identical.

Everything that feeds randomness is pinned: torch/Python (and NumPy, when installed) seeds, the thread
count, a DataLoader with worker processes whose shuffling comes from an explicit ``generator`` and whose
per-worker RNGs are seeded through ``worker_init_fn``; the Dataset itself draws random augmentations in
the workers, and the model uses dropout. Usage: repro_train.py SEED WORKERS DEVICE THREADS
"""

from __future__ import annotations

import hashlib
import json
import random
import sys

import torch
from torch.utils.data import DataLoader, Dataset

try:
    import numpy as np
except ImportError:  # the suite does not need NumPy; seed it when it is there
    np = None


def tensor_bytes(t: torch.Tensor) -> bytes:
    return bytes(t.detach().cpu().contiguous().view(torch.uint8).untyped_storage())


class NoisyImages(Dataset):
    """Fixed base data plus per-item random noise drawn in the worker from torch, random (and NumPy)."""

    def __init__(self, n: int = 48) -> None:
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(n, 1, 12, 12, generator=g)
        self.y = torch.randint(0, 4, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        noise = 0.1 * torch.randn(1, 12, 12) + random.random() * 0.01
        if np is not None:
            noise = noise + float(np.random.rand()) * 0.01
        return self.x[i] + noise, self.y[i]


def worker_init_fn(worker_id: int) -> None:
    seed = torch.initial_seed() % 2**32  # base_seed + worker_id, drawn from the loader's generator
    random.seed(seed)
    if np is not None:
        np.random.seed(seed)


def main(seed: int, workers: int, device: str, threads: int) -> dict:
    torch.set_num_threads(threads)
    random.seed(seed)
    torch.manual_seed(seed)
    if np is not None:
        np.random.seed(seed)
    if device == "cuda":  # CPU kernels of this model are deterministic already; CUDA needs the switches
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    loader = DataLoader(
        NoisyImages(),
        batch_size=8,
        shuffle=True,
        num_workers=workers,
        generator=torch.Generator().manual_seed(seed),
        worker_init_fn=worker_init_fn,
        persistent_workers=workers > 0,
    )
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.2),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 10 * 10, 4),
    ).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    batches = hashlib.sha256()
    for _ in range(2):
        for x, y in loader:
            batches.update(tensor_bytes(x))
            batches.update(tensor_bytes(y))
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
            opt.step()
    params = hashlib.sha256(b"".join(tensor_bytes(p) for p in model.parameters()))
    return {
        "batch_sha256": batches.hexdigest(),
        "param_sha256": params.hexdigest(),
        "threads": torch.get_num_threads(),
        "numpy": np is not None,
    }


if __name__ == "__main__":
    seed, workers, device, threads = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    print(json.dumps(main(seed, workers, device, threads)))
