"""torch.distributed from the standard environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), which the launcher sets; a lone process gets a private in-memory group.

Stages call this and never read scheduler variables: the launcher translates those.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True)
class Rank:
    rank: int
    world_size: int
    local_rank: int

    @property
    def is_first(self) -> bool:
        return self.rank == 0


def from_env() -> Rank:
    return Rank(
        int(os.environ.get("RANK", 0)),
        int(os.environ.get("WORLD_SIZE", 1)),
        int(os.environ.get("LOCAL_RANK", 0)),
    )


def init(backend: str | None = None, timeout_minutes: int = 30) -> Rank:
    """Initialise the default process group once (gloo on CPU, nccl on GPU)."""
    import torch
    import torch.distributed as dist

    me = from_env()
    if dist.is_initialized():
        return me
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(me.local_rank)
    timeout = timedelta(minutes=timeout_minutes)
    if me.world_size == 1 and "MASTER_ADDR" not in os.environ:
        dist.init_process_group(
            backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
        )
    else:
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
    return me


def any_rank(flag: bool, device=None) -> bool:
    """True on every rank when `flag` is true on any: ranks act on a condition together (a stop
    signal, a non-finite loss) instead of one rank alone leaving the others waiting."""
    import torch
    import torch.distributed as dist

    agreed = torch.tensor([1.0 if flag else 0.0], device=device)
    if dist.is_initialized():
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return bool(agreed.item())


def shutdown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def group_for_this_call() -> Iterator[None]:
    """A process group for code that asks for a rank (megatron-core's dataset builder) when
    none exists yet, removed afterwards: a later stage in this process sets up its own (nccl
    on GPUs), which an existing gloo group would prevent."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    init("gloo")
    try:
        yield
    finally:
        shutdown()
