"""The seam between the one training loop and the hardware it runs on.

A backend supplies what differs between CPU and GPU: the layer spec and fusion switches of the
model, the data-parallel wrapper, the optimizer, the checkpoint format of the weights and the
optimizer state (saved now, or by the asynchronous request `save` returns). `select` picks one
for the job's device.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Protocol

import torch

from pipeline.config import PipelineConfig
from pipeline.runtime.device import resolve_device


class Backend(Protocol):
    name: str
    device: torch.device

    def transformer_options(self, cfg: PipelineConfig) -> dict[str, Any]: ...
    def kernels(self, cfg: PipelineConfig) -> str: ...  # what runs the layers, for the log
    def layer_spec(self, cfg: PipelineConfig, config: Any, vp_stage: int | None) -> Any: ...
    def adapt_model(self, model: torch.nn.Module) -> torch.nn.Module: ...
    def wrap(self, chunks: list[torch.nn.Module], cfg: PipelineConfig) -> list[torch.nn.Module]: ...
    def optimizer(self, chunks: list[torch.nn.Module], cfg: PipelineConfig) -> Any: ...
    def schedule_context(self) -> contextlib.AbstractContextManager: ...
    def save(
        self, folder: Path, chunks: list[torch.nn.Module], optimizer: Any, asynchronous: bool
    ) -> Any | None: ...
    def load(self, folder: Path, chunks: list[torch.nn.Module], optimizer: Any | None) -> None: ...


def select(cfg: PipelineConfig) -> Backend:
    """Transformer Engine on CUDA, the CPU backend otherwise (train.device)."""
    if resolve_device(cfg.train.device) == "cuda":
        from pipeline.model.backends.te import TransformerEngineBackend

        return TransformerEngineBackend()
    from pipeline.model.backends.cpu import CpuBackend

    return CpuBackend()
