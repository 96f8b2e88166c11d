"""The config schema: one dataclass per section of conf/, each leaf key declared once with its
whole story (pipeline.config.keys):

    name: type = key(default, ROLE, "help line", rule=..., command=..., script=..., common=...)

- ROLE, required: OUTPUT (what an output is made from: changed, it is redone or refused),
  CONTINUE (changed, a training goes on), NOT_SETTING (how, where or how fast: changed, every
  output stays valid). Provenance records the OUTPUT and CONTINUE keys of a section.
- choices: the field's type is a Choice enum (pipeline.config.choices);
- rule=AT_LEAST_ONE, POSITIVE, A_FILE, ... (pipeline.config.rules): what a value must be beyond
  its type, checked by pipeline.config.checks and shown by --help;
- command=True (or `command(...)`): what to run, where and how; each command line's own, never
  replayed from the run's history; script=True: the value is written into job scripts;
- common=True: listed by --help with its help line.

Each section is a dataclass of its own module in pipeline.config.sections (data and tokenizer,
model and parallel, train, eval and export, cluster, resilience, logging); this module joins
them into PipelineConfig and is where the rest of the package imports them from. A new key
needs nothing more than its field there, the code that reads it, and its test.
Registered in Hydra's ConfigStore as `base_config` (pipeline.config.compose), so a typo or a
wrong type in any YAML file or override fails at composition, naming the key. The composed
config becomes an instance of `PipelineConfig` once, at the command line, and every step and
component receives it, or the section it needs, typed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from pipeline.config import rules as r
from pipeline.config.choices import AUTO
from pipeline.config.keys import command
from pipeline.config.sections.cluster import ClusterConfig
from pipeline.config.sections.data import DataConfig, SourceConfig, TokenizerConfig
from pipeline.config.sections.model import ModelConfig, MoeConfig, ParallelConfig
from pipeline.config.sections.resilience import ResilienceConfig
from pipeline.config.sections.results import EvalConfig, ExportConfig
from pipeline.config.sections.tracking import LoggingConfig, MlflowConfig, WandbConfig
from pipeline.config.sections.train import TrainConfig

__all__ = [
    "AUTO",
    "DATA_SECTIONS",
    "DEFAULT_STAGES",
    "STAGES",
    "ClusterConfig",
    "DataConfig",
    "EvalConfig",
    "ExportConfig",
    "LoggingConfig",
    "MlflowConfig",
    "ModelConfig",
    "MoeConfig",
    "ParallelConfig",
    "PipelineConfig",
    "ResilienceConfig",
    "SourceConfig",
    "TokenizerConfig",
    "TrainConfig",
    "WandbConfig",
]

STAGES = ("tokenize", "train", "evaluate", "export")
DEFAULT_STAGES = STAGES[:3]  # export: added to stages when wanted
# The sections the run that holds the data settles (data.prepared): a run that trains on
# another's data takes these from that run's history
DATA_SECTIONS = ("data", "tokenizer")


@dataclass
class PipelineConfig:
    workdir: str = command(
        MISSING, "the run folder", rule=r.FOLDER_TO_WRITE, script=True, common=True
    )
    stages: list[str] = command(
        help="the stages to run",
        factory=lambda: list(DEFAULT_STAGES),
        rule=r.in_order(STAGES),
        common=True,
    )
    dry_run: bool = command(False, "plan and show the jobs, run nothing")
    # what they held is moved to replaced/ in the run folder
    force: str | None = command(None, "redo this step and every step after it", common=True)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    resilience: ResilienceConfig = field(default_factory=ResilienceConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
