"""The evaluate step: one process on one GPU, or the CPU. Complete when eval/DONE.json records
the eval settings asked for now: a changed eval.* setting redoes the evaluation alone."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from pipeline.config import PipelineConfig
from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.core.steps import Placement

if TYPE_CHECKING:
    from pipeline.evaluation.evaluate import EvaluationRecord


class EvaluateStep:
    name = "evaluate"
    placement = Placement.ONE_DEVICE

    def is_complete(self, cfg: PipelineConfig) -> bool:
        done = files.read_json_or_none(RunPaths.of(cfg.workdir).eval_done)
        return done is not None and done.get("config") == dataclasses.asdict(cfg.eval)

    def run(self, cfg: PipelineConfig) -> EvaluationRecord:
        if self.is_complete(cfg):
            return files.read_json(RunPaths.of(cfg.workdir).eval_done)
        from pipeline.evaluation.evaluate import evaluate  # torch: imported by the job

        return evaluate(cfg)


EVALUATE = EvaluateStep()
