"""Model weights (and the GPU optimizer) in megatron-core's distributed checkpoint format.

Every tensor is stored once, under its global shape and a key that does not depend on the layer
spec (megatron-core's local spec saves its norms under Transformer Engine's fused names), so a
checkpoint written under one tensor/pipeline layout, with Transformer Engine layers or without,
loads under any other, on GPUs or on the CPU.
"""

from __future__ import annotations

import contextlib
import queue
from pathlib import Path

import torch

from pipeline.runtime.device import cuda_calls_on_cpu

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


def _results_in_this_process() -> None:
    """Saving synchronously, megatron-core's writer hands its results back within this process,
    but by default through a queue served by a separate manager process. That process does not
    inherit our signal handlers, so the job's signals (the time-limit warning, preemption) kill
    it, and the very save they ask for then fails. A plain queue does the same job here."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if getattr(filesystem_async, "_results_queue", False) is None:
        filesystem_async._results_queue = queue.Queue()


def save(folder: Path, sharded_state: dict, on_cpu: bool = False) -> None:
    """Collective: write `sharded_state` into folder/dist (each rank its own shards); `on_cpu`:
    the job runs on the CPU (gloo), whatever the host has."""
    from megatron.core import dist_checkpointing

    _results_in_this_process()

    target = folder / FOLDER
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        target.mkdir(parents=True, exist_ok=True)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    # its writer waits on CUDA copies and puts a flag for gloo on the CUDA device
    with cuda_calls_on_cpu() if on_cpu else contextlib.nullcontext():
        dist_checkpointing.save(sharded_state, str(target))


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

    return dist_checkpointing.load(sharded_state, _written(folder))


def load_weights(folder: Path, chunks: list[torch.nn.Module]) -> None:
    """Load the weights alone into `chunks`, whatever layout and layer spec wrote them. Only
    Transformer Engine's per-module extra state (fp8 scaling history) may be absent, as it is
    from a checkpoint written without TE: those modules keep their fresh state."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.validation import StrictHandling

    # megatron-core's "unexpected" keys: asked for, and not in the checkpoint
    state, _, absent = dist_checkpointing.load(
        model_state(chunks), _written(folder), strict=StrictHandling.RETURN_UNEXPECTED
    )
    weights = sorted(key for key in absent if not key.split("/")[0].endswith("_extra_state"))
    if weights:
        raise RuntimeError(
            f"checkpoint {folder} holds no {weights[0]} ({len(weights)} tensors of this model "
            "are not in it): it was written for another model shape"
        )
    for i, chunk in enumerate(chunks):
        missing, unexpected = unwrap(chunk).load_state_dict(
            state[chunk_key(i, len(chunks))], strict=False
        )
        left = [k for k in [*missing, *unexpected] if not k.endswith("_extra_state")]
        if left:
            raise RuntimeError(f"checkpoint {folder}: {left[0]} does not fit this model")
