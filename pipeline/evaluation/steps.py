"""The evaluate step: one process on one GPU, or the CPU. eval/DONE.json records what the
evaluation was made from: the eval settings, the data, the training and the very checkpoint
it measured. Any change redoes it (nothing is lost): another eval.* setting, a training that
went on, a new best checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.config import PipelineConfig, keys
from pipeline.core import provenance
from pipeline.core.paths import RunPaths
from pipeline.core.provenance import MadeFrom
from pipeline.core.steps import Change, MarkedStep, Placement
from pipeline.data.steps import VERIFY
from pipeline.training import checkpoint_records
from pipeline.training.steps import TRAIN

if TYPE_CHECKING:
    from pipeline.evaluation.evaluate import EvaluationRecord


class EvaluateStep(MarkedStep):
    name = "evaluate"
    placement = Placement.ONE_DEVICE

    def made_from(self, cfg: PipelineConfig) -> MadeFrom:
        chosen = checkpoint_records.chosen(
            RunPaths.of(cfg.workdir), str(cfg.eval.checkpoint), cfg.eval.select_by
        )
        return provenance.made_from(
            keys.settings(cfg.eval, "eval"),
            verify=VERIFY.fingerprint(cfg),
            train=TRAIN.fingerprint(cfg),
            checkpoint=chosen or "(none)",
        )

    def marker(self, cfg: PipelineConfig) -> Path:
        return RunPaths.of(cfg.workdir).eval_done

    def outputs(self, cfg: PipelineConfig) -> list[Path]:
        paths = RunPaths.of(cfg.workdir)
        return [paths.eval_dir, paths.summary, paths.report, paths.report_html]

    def change(self, recorded: MadeFrom, now: MadeFrom) -> Change:
        return Change.REDO  # nothing is lost

    def make(self, cfg: PipelineConfig, made_from: MadeFrom) -> EvaluationRecord:
        from pipeline.evaluation.evaluate import evaluate  # torch: imported by the job

        return evaluate(cfg, made_from)


EVALUATE = EvaluateStep()
