"""Model weights (and the GPU optimizer) in megatron-core's distributed checkpoint format.

Every tensor is stored once, under its global shape and a key that does not depend on the layer
spec (megatron-core's local spec saves its norms under Transformer Engine's fused names), so a
checkpoint written under one tensor/pipeline layout, with Transformer Engine layers or without,
loads under any other, on GPUs or on the CPU.
"""

from __future__ import annotations

import contextlib
import pickle
import queue
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from pipeline.core.errors import StageError
from pipeline.runtime.device import cuda_calls_on_cpu

if TYPE_CHECKING:
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncRequest

FOLDER = "dist"  # inside a checkpoint folder


def unwrap(chunk: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel inside DistributedDataParallel and Float16Module: checkpoint keys then do
    not depend on the wrappers."""
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk


def chunk_key(index: int, count: int) -> str:
    return "model" if count == 1 else f"model{index}"


def model_state(chunks: list[torch.nn.Module]) -> dict:
    """The sharded state dict of the model chunks on this rank (virtual stages as model0..)."""
    return {chunk_key(i, len(chunks)): unwrap(c).sharded_state_dict() for i, c in enumerate(chunks)}


class _ResultsFile:
    """How megatron-core's writer hands back its results (`put` where it writes, `get_nowait`
    here, once it is done): a file in the checkpoint being written, gone once read. Its
    default, a queue served by a separate manager process, does not inherit our signal
    handlers, so the job's signals (the time-limit warning, preemption) kill it and the very
    save they ask for fails. A pipe from a forked writer holds the writer from exiting once a
    large checkpoint's results fill it, since nobody reads it until the writer has exited."""

    def __init__(self, folder: Path) -> None:
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self.path = folder / f".writer-results-rank{rank:05d}" / "results.pickle"

    def put(self, results: object) -> None:
        self.path.parent.mkdir(exist_ok=True)
        written = self.path.with_suffix(".partial")
        written.write_bytes(pickle.dumps(results))
        written.rename(self.path)

    def get_nowait(self) -> object:
        if not self.path.exists():
            raise queue.Empty
        results = pickle.loads(self.path.read_bytes())
        shutil.rmtree(self.path.parent)
        return results


def _data_parallel_group():
    """The data-parallel group, if the job has more than one rank in it: saves and loads are
    then shared across its ranks (each writes, or reads, its own part of the replicated
    tensors once) instead of done whole by each replica's first rank, or read by every one."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return None
    if parallel_state.get_data_parallel_world_size() < 2:
        return None
    return parallel_state.get_data_parallel_group()


def save(
    folder: Path, sharded_state: dict, on_cpu: bool = False, asynchronous: bool = False
) -> AsyncRequest | None:
    """Collective: write `sharded_state` into folder/dist (each rank its own shards); `on_cpu`:
    the job runs on the CPU (gloo), whatever the host has. `asynchronous`: only the small
    common part is written now; the tensors are written by the request returned, which the
    caller schedules (pipeline.training.saver)."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    from megatron.core.dist_checkpointing.strategies import filesystem_async
    from megatron.core.dist_checkpointing.strategies.fully_parallel import (
        FullyParallelSaveStrategyWrapper,
    )

    filesystem_async._results_queue = _ResultsFile(folder)
    target = folder / FOLDER
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        target.mkdir(parents=True, exist_ok=True)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    strategy = get_default_save_sharded_strategy()
    group = _data_parallel_group()
    if group is not None:
        strategy = FullyParallelSaveStrategyWrapper(strategy, group)
    # its writer waits on CUDA copies and puts a flag for gloo on the CUDA device
    with cuda_calls_on_cpu() if on_cpu else contextlib.nullcontext():
        return dist_checkpointing.save(
            sharded_state, str(target), strategy, async_sharded_save=asynchronous
        )


def _written(folder: Path) -> str:
    target = folder / FOLDER
    if not target.is_dir():
        raise RuntimeError(
            f"checkpoint {folder} has no {FOLDER}/ folder: it was written by an older version "
            "of this pipeline (model.pt), which this one does not read"
        )
    return str(target)


def load(folder: Path, sharded_state: dict) -> dict:
    """Collective: the state dict asked for by `sharded_state`, read from folder/dist; every key
    must be in the checkpoint (a resume restores all of it)."""
    from megatron.core import dist_checkpointing

    from pipeline.model.checkpoint_reader import threaded_reading

    with threaded_reading():
        return dist_checkpointing.load(sharded_state, _written(folder), _load_strategy(folder))


def _load_strategy(folder: Path):
    """megatron-core's default reader, shared across the data-parallel ranks when there are
    several: each reads its part of the replicated tensors once and passes it to the others
    (over NCCL: megatron-core exchanges them on the GPU, so gloo ranks each read their own)."""
    from megatron.core.dist_checkpointing.serialization import get_default_load_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.fully_parallel import (
        FullyParallelLoadStrategyWrapper,
    )

    strategy = get_default_load_sharded_strategy(_written(folder))
    group = _data_parallel_group()
    if group is None or torch.distributed.get_backend(group) != "nccl":
        return strategy
    return FullyParallelLoadStrategyWrapper(strategy, group)


def saved_optimizer_format(folder: Path) -> str | None:
    """How megatron-core's distributed optimizer laid out its state in this checkpoint (its
    `param_state_sharding_type`, kept in the checkpoint's common part), or None: saved
    without a distributed optimizer."""
    from megatron.core import dist_checkpointing

    common = dist_checkpointing.load_common_state_dict(_written(folder))
    found = [value for key, value in _items(common.get("optimizer", {})) if key == _FORMAT_KEY]
    return found[0] if found else None


_FORMAT_KEY = "param_state_sharding_type"


def _items(tree: object):
    """Every (key, value) of a nested dict, depth first."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield key, value
            yield from _items(value)


def load_weights(folder: Path, chunks: list[torch.nn.Module]) -> None:
    """Load the weights alone into `chunks`, whatever layout and layer spec wrote them. Only
    Transformer Engine's per-module extra state (fp8 scaling history) may be absent, as it is
    from a checkpoint written without TE: those modules keep their fresh state."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.validation import StrictHandling

    from pipeline.model.checkpoint_reader import threaded_reading

    # megatron-core's "unexpected" keys: asked for, and not in the checkpoint
    with threaded_reading():
        state, _, absent = dist_checkpointing.load(
            model_state(chunks),
            _written(folder),
            _load_strategy(folder),
            strict=StrictHandling.RETURN_UNEXPECTED,
        )
    weights = sorted(key for key in absent if not key.split("/")[0].endswith("_extra_state"))
    if weights:
        raise StageError(
            f"checkpoint {folder} holds no {weights[0]} ({len(weights)} tensors of this model "
            "are not in it): it was written for another model shape"
        )
    for i, chunk in enumerate(chunks):
        missing, unexpected = unwrap(chunk).load_state_dict(
            state[chunk_key(i, len(chunks))], strict=False
        )
        left = [k for k in [*missing, *unexpected] if not k.endswith("_extra_state")]
        if left:
            raise StageError(f"checkpoint {folder}: {left[0]} does not fit this model")
