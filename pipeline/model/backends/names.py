"""The backends' names, without importing them (they need torch): what a checkpoint's layout
records as its "backend", and which one a config's training job will use."""

from __future__ import annotations

CPU = "cpu"
TRANSFORMER_ENGINE = "transformer_engine"


def for_training(on_gpu: bool) -> str:
    """The backend a training job runs on: Transformer Engine's on GPUs
    (pipeline.config.derived.trains_on_gpu), the CPU one elsewhere."""
    return TRANSFORMER_ENGINE if on_gpu else CPU
