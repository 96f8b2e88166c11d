"""The run's configuration: the schema (one dataclass per section of conf/), its checks, the
values derived from it, and the way from Hydra's composition to the typed config."""

from pipeline.config.compose import compose, load, read, recompose, register, to_yaml, typed
from pipeline.config.schema import (
    STAGES,
    ClusterConfig,
    DataConfig,
    EvalConfig,
    ExportConfig,
    ModelConfig,
    MoeConfig,
    ParallelConfig,
    PipelineConfig,
    TokenizerConfig,
    TrainConfig,
)
from pipeline.core.errors import ConfigError

__all__ = [
    "STAGES",
    "ClusterConfig",
    "ConfigError",
    "DataConfig",
    "EvalConfig",
    "ExportConfig",
    "ModelConfig",
    "MoeConfig",
    "ParallelConfig",
    "PipelineConfig",
    "TokenizerConfig",
    "TrainConfig",
    "compose",
    "load",
    "read",
    "recompose",
    "register",
    "to_yaml",
    "typed",
]
