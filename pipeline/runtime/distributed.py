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

from pipeline.core.errors import StageError

# Set by the launcher with the other variables: seconds a rank waits for all of them to meet.
RENDEZVOUS_TIMEOUT_ENV = "PIPELINE_RENDEZVOUS_TIMEOUT_S"
DEFAULT_RENDEZVOUS_TIMEOUT_S = 300.0


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
        store = meet(
            me, float(os.environ.get(RENDEZVOUS_TIMEOUT_ENV, DEFAULT_RENDEZVOUS_TIMEOUT_S))
        )
        store.set_timeout(timeout)  # from here on, collectives' patience, not the meeting's
        dist.init_process_group(
            backend, store=store, rank=me.rank, world_size=me.world_size, timeout=timeout
        )
    return me


def meet(me: Rank, timeout_s: float):
    """Every rank connects to the store on MASTER_ADDR:MASTER_PORT, which rank 0 serves until
    all have come. A rank that cannot reach it, or a rank 0 that some rank never reaches,
    fails after `timeout_s` in one line, so a job with a wrong address ends instead of
    holding its nodes."""
    import torch.distributed as dist

    address = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    try:
        return dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            me.world_size,
            is_master=me.is_first,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=True,
        )
    except (RuntimeError, OSError) as e:  # torch's DistNetworkError, DistStoreError
        cause = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if me.is_first and "EADDRINUSE" in cause:
            raise StageError(
                f"rendezvous: rank 0 of {me.world_size} could not listen on {address}: the "
                "port is in use on the first node; rerun (a requeued job keeps its port: set "
                "MASTER_PORT to a free one)"
            ) from None
        who = "some rank did not reach" if me.is_first else "could not reach"
        raise StageError(
            f"rendezvous: rank {me.rank} of {me.world_size}: {who} {address} within "
            f"cluster.rendezvous_timeout_s={timeout_s:g} s ({cause})"
        ) from None


def any_rank(flag: bool, device=None) -> bool:
    """True on every rank when `flag` is true on any: ranks act on a condition together (a stop
    signal, a non-finite loss) instead of one rank alone leaving the others waiting."""
    import torch
    import torch.distributed as dist

    agreed = torch.tensor([1.0 if flag else 0.0], device=device)
    if dist.is_initialized():
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return bool(agreed.item())


def sum_over_job(values):
    """`values` (a CPU tensor) summed over every rank of the job, on the device the default
    group's collectives take (NCCL: this rank's GPU); back on the CPU."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return values
    nccl = dist.get_backend() == "nccl"
    on_device = values.to(torch.device("cuda", torch.cuda.current_device()) if nccl else "cpu")
    dist.all_reduce(on_device)
    return on_device.cpu()


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
