"""A real memory cgroup for the tests: a child of this process's own (cgroup v2 or v1), with a memory limit and
no swap, so that the kernel's OOM killer really kills what runs in it when it needs more.

The tests put compiles into it (a compiler wrapper on PATH writes its own pid into ``cgroup.procs``, then
runs the real compiler), so a compile that needs more than the limit is killed by the kernel exactly as in a
container that is too small: SIGKILL, and the counters in ``memory.events`` / ``memory.oom_control``.
Creating one needs root (or a delegated cgroup); :func:`memory_cgroup` says why it cannot.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from torchkiln.host import cgroup


@dataclass(frozen=True)
class MemCgroup:
    version: int
    dir: Path

    @property
    def procs(self) -> Path:
        return self.dir / "cgroup.procs"

    def join(self) -> None:
        """Move the calling process into the cgroup (for ``preexec_fn``: the child before it execs)."""
        self.procs.write_text("0")


def _make(parent: Path, version: int, limit: int) -> MemCgroup | None:
    child = parent / f"torchkiln-test-{uuid.uuid4().hex[:8]}"
    try:
        child.mkdir()
    except OSError:
        return None
    limit_file, swap_file, no_swap = (
        ("memory.max", "memory.swap.max", "0")
        if version == 2
        else ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes", str(limit))  # v1: memory + swap
    )
    try:
        (child / limit_file).write_text(str(limit))
        if (child / swap_file).exists():
            (child / swap_file).write_text(no_swap)
    except OSError:
        _remove(child)
        return None
    return MemCgroup(version, child)


def _candidates(own: cgroup.Cgroup) -> list[Path]:
    """Where a child may go: under this process's cgroup, else beside it (cgroup v2 keeps processes out of a
    group whose children have controllers, so the parent of a leaf is the place there)."""
    return [own.dir] + ([own.dir.parent] if own.version == 2 and own.dir != own.mount else [])


@contextlib.contextmanager
def memory_cgroup(limit: int) -> Iterator[MemCgroup | str]:
    """A child memory cgroup limited to ``limit`` bytes, removed afterwards; a reason (str) when this host
    does not allow one."""
    own = cgroup.find("memory")
    if own is None:
        yield "this process has no memory cgroup (no cgroup v2 memory controller, no v1 memory hierarchy)"
        return
    made = next((m for p in _candidates(own) if (m := _make(p, own.version, limit)) is not None), None)
    if made is None:
        yield f"cannot create a memory cgroup under {own.dir} (not root, or not delegated)"
        return
    try:
        yield made
    finally:
        _remove(made.dir)


def _remove(directory: Path) -> None:
    """rmdir works once the cgroup is empty: its processes (compiles that ended) may take a moment to go."""
    for _ in range(100):
        try:
            os.rmdir(directory)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
