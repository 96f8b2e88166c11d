"""Reading a distributed checkpoint with several threads per rank.

megatron-core loads through torch.distributed.checkpoint's FileSystemReader, which reads the
tensors this rank needs one after another in one thread: a 1.3B resume (17.8 GiB on one GPU)
read at about 1.3 GB/s. Each read item (unpickle the tensor from its file, narrow it, copy
it into the model or optimizer tensor that asked for it) is independent of the others, and
file reads, unpickling into a buffer and copies to the GPU release the GIL. So this reader
splits the plan into a few runs of items, each in file order and of about equal bytes, and has
torch's own reader read each run in its own thread: the same code reads every item, once.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from megatron.core.dist_checkpointing.strategies.cached_metadata_filesystem_reader import (
    CachedMetadataFileSystemReader,
)
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
from torch.futures import Future

MAX_THREADS = 8  # beyond this the GPU copies and the page cache, not the threads, set the pace


def default_threads() -> int:
    """This rank's share of the CPUs it may run on (ranks of a node share them), at most
    MAX_THREADS."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, min(MAX_THREADS, (cpus or 1) // max(1, ranks_here)))


class ThreadedReader(CachedMetadataFileSystemReader):
    """megatron-core's reader (metadata read once), with read_data spread over threads."""

    def __init__(self, path: str | os.PathLike, threads: int) -> None:
        super().__init__(path)
        self.threads = threads
        self.runs_read = 0  # how many runs the last read_data split its plan into

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        runs = self.split(plan)
        self.runs_read = len(runs)
        read = super().read_data
        if len(runs) == 1:
            return read(plan, planner)
        with ThreadPoolExecutor(len(runs), thread_name_prefix="checkpoint-read") as pool:
            for done in [pool.submit(read, replace(plan, items=run), planner) for run in runs]:
                done.result()  # the first failure is raised here, as in one thread
        finished: Future[None] = Future()
        finished.set_result(None)
        return finished

    def split(self, plan: LoadPlan) -> list[list]:
        """The plan's items in file order, cut into at most `threads` runs of about equal
        bytes (a run may span files; each item is in exactly one run)."""

        def where(item) -> tuple[str, int]:
            info = self.storage_data[item.storage_index]
            return info.relative_path, info.offset

        items = sorted(plan.items, key=where)
        sizes = [self.storage_data[item.storage_index].length for item in items]
        share = sum(sizes) / max(1, min(self.threads, len(items)))
        runs: list[list] = [[]]
        filled = 0
        for item, size in zip(items, sizes, strict=True):
            if runs[-1] and filled + size / 2 > share * len(runs) and len(runs) < self.threads:
                runs.append([])
            runs[-1].append(item)
            filled += size
        return runs


@contextlib.contextmanager
def threaded_reading(threads: int | None = None) -> Iterator[list[ThreadedReader]]:
    """megatron-core's torch_dist loads inside this block read through ThreadedReader; yields
    the readers made. megatron-core makes its reader in a module function; it is swapped for
    the block's duration (loads run in the main thread, one at a time)."""
    from megatron.core.dist_checkpointing.strategies import torch as torch_strategy

    count = threads or default_threads()
    made: list[ThreadedReader] = []

    def reader(path: str | os.PathLike, cache_metadata: bool = False) -> ThreadedReader:
        made.append(ThreadedReader(path, count))
        return made[-1]

    original = torch_strategy._get_filesystem_reader
    torch_strategy._get_filesystem_reader = reader
    try:
        yield made
    finally:
        torch_strategy._get_filesystem_reader = original
