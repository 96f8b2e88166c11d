"""The backends' names, without importing them (they need torch): what a checkpoint's layout
records as its "backend", and which one a config's training job will use."""

from __future__ import annotations

from pipeline.config import PipelineConfig
from pipeline.config.derived import trains_on_gpu

CPU = "cpu"
TRANSFORMER_ENGINE = "transformer_engine"


def for_training(cfg: PipelineConfig) -> str:
    """The backend the training job of `cfg` runs on, as the launcher can tell before it runs."""
    return TRANSFORMER_ENGINE if trains_on_gpu(cfg) else CPU
