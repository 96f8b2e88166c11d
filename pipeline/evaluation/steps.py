"""The evaluate step: one process on one GPU, or the CPU. eval/DONE.json records what the
evaluation was made from: the eval settings, the data, the training and the very checkpoint
it measured. Any change redoes it (nothing is lost): another eval.* setting, a training that
went on, a new best checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.config import PipelineConfig
from pipeline.core import files, provenance
from pipeline.core.paths import RunPaths
from pipeline.core.provenance import MadeFrom
from pipeline.core.steps import Placement, RedoneWhenChanged
from pipeline.data.steps import VERIFY
from pipeline.training import checkpoint_records
from pipeline.training.steps import TRAIN

if TYPE_CHECKING:
    from pipeline.evaluation.evaluate import EvaluationRecord


class EvaluateStep(RedoneWhenChanged):
    name = "evaluate"
    placement = Placement.ONE_DEVICE

    def made_from(self, cfg: PipelineConfig) -> MadeFrom:
        chosen = checkpoint_records.chosen(RunPaths.of(cfg.workdir), str(cfg.eval.checkpoint))
        return provenance.made_from(
            provenance.section(cfg.eval, "eval"),
            verify=provenance.fingerprint(VERIFY.made_from(cfg)),
            train=provenance.fingerprint(TRAIN.made_from(cfg)),
            checkpoint=chosen or "(none)",
        )

    def marker(self, cfg: PipelineConfig) -> Path:
        return RunPaths.of(cfg.workdir).eval_done

    def outputs(self, cfg: PipelineConfig) -> list[Path]:
        paths = RunPaths.of(cfg.workdir)
        return [paths.eval_dir, paths.summary, paths.report, paths.report_html]

    def run(self, cfg: PipelineConfig) -> EvaluationRecord:
        if self.is_complete(cfg):
            return files.read_json(RunPaths.of(cfg.workdir).eval_done)
        from pipeline.evaluation.evaluate import evaluate  # torch: imported by the job

        return evaluate(cfg, self.made_from(cfg))


EVALUATE = EvaluateStep()
