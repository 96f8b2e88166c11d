"""The train step: every rank of the training job runs it. Complete when train/DONE.json is
there; otherwise it resumes from the newest valid checkpoint (or starts) and trains to
train.steps, or saves and stops early on a signal (Interrupted)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline import config
from pipeline.config import PipelineConfig
from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.core.steps import Interrupted, Placement
from pipeline.training import signals

if TYPE_CHECKING:
    from pipeline.training.trainer import TrainRecord


class TrainStep:
    name = "train"
    placement = Placement.TRAINING_RANKS

    def is_complete(self, cfg: PipelineConfig) -> bool:
        return RunPaths.of(cfg.workdir).train_done.exists()

    def run(self, cfg: PipelineConfig) -> TrainRecord | Interrupted:
        paths = RunPaths.of(cfg.workdir)
        if self.is_complete(cfg):
            return files.read_json(paths.train_done)
        signals.listen()  # a stop signal from now on is acted on at the first step boundary
        from pipeline.training.trainer import Trainer  # torch: imported by the job that trains

        trainer = Trainer(cfg)
        if trainer.rank.is_first:
            files.write_text(paths.train_config, config.to_yaml(cfg))
        return trainer.fit()


TRAIN = TrainStep()
