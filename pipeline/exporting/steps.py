"""The export step: one process on a CPU. Its folder's export.json, written last, records what
the export was made from: its settings, the tokenizer, the training and the very checkpoint
(eval.checkpoint) it holds. Any change redoes it; a folder that is not an export is never
overwritten."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.config import PipelineConfig, keys
from pipeline.core import provenance
from pipeline.core.paths import RunPaths
from pipeline.core.provenance import MadeFrom
from pipeline.core.steps import Change, MarkedStep, Placement
from pipeline.data.steps import VERIFY
from pipeline.model.huggingface.files import EXPORT_RECORD as RECORD
from pipeline.training import checkpoint_records
from pipeline.training.steps import TRAIN


def folder(cfg: PipelineConfig) -> Path:
    """Where the model folder goes: export.out, else the run folder's export/."""
    return Path(cfg.export.out) if cfg.export.out else RunPaths.of(cfg.workdir).export_dir


class ExportStep(MarkedStep):
    name = "export"
    placement = Placement.CPU

    def made_from(self, cfg: PipelineConfig) -> MadeFrom:
        chosen = checkpoint_records.chosen(
            RunPaths.of(cfg.workdir), str(cfg.eval.checkpoint), cfg.eval.select_by
        )
        settings = keys.settings(cfg.export, "export")
        return provenance.made_from(
            settings,
            verify=VERIFY.fingerprint(cfg),
            train=TRAIN.fingerprint(cfg),
            checkpoint=chosen or "(none)",
        )

    def marker(self, cfg: PipelineConfig) -> Path:
        return folder(cfg) / RECORD

    def outputs(self, cfg: PipelineConfig) -> list[Path]:
        # force=export moves aside what is in the run folder alone; export.out is replaced
        # by the export itself, once the new one is whole
        inside = RunPaths.of(cfg.workdir).root.resolve() in folder(cfg).resolve().parents
        return [folder(cfg)] if inside else []

    def change(self, recorded: MadeFrom, now: MadeFrom) -> Change:
        return Change.REDO  # nothing is lost

    def make(self, cfg: PipelineConfig, made_from: MadeFrom) -> dict[str, Any]:
        from pipeline.exporting.export import export  # torch: imported by the job

        return export(cfg, made_from, folder(cfg))


EXPORT = ExportStep()
