"""The downstream step: after training, one job of the training's model-parallel size (tensor x
pipeline ranks, a GPU each; as many processes on a CPU run) scores the last checkpoint on
eval.harness_tasks, and the one eval.checkpoint names when that is another, unless it was
scored while training went on (eval.harness_every). It runs before the evaluation, which may
choose its checkpoint by these scores (eval.select_by). Only in the graph when tasks are
configured; eval/downstream/DONE.json records the checkpoints it scored."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import PipelineConfig
from pipeline.core import files, provenance
from pipeline.core.paths import RunPaths
from pipeline.core.provenance import MadeFrom
from pipeline.core.steps import Change, MarkedStep, Placement
from pipeline.runtime import distributed
from pipeline.training.steps import TRAIN


def to_score(cfg: PipelineConfig) -> list[Path]:
    """The last checkpoint, then the one eval.checkpoint names by validation loss (best), or
    as a folder, when that is another; none before training saved one."""
    paths = RunPaths.of(cfg.workdir)
    latest = paths.latest_checkpoint()
    found = [paths.checkpoints / latest] if latest else []
    choice = str(cfg.eval.checkpoint)
    if choice == "best" and not cfg.eval.select_by:
        best = files.read_json_or_none(paths.best_checkpoint_record)
        named = paths.checkpoints / best["name"] if best else None
    elif choice not in ("best", "latest"):
        named = Path(choice).expanduser()
    else:
        named = None
    if named is not None and named not in found:
        found.append(named)
    return found


class DownstreamStep(MarkedStep):
    name = "downstream"
    placement = Placement.MODEL_RANKS

    def made_from(self, cfg: PipelineConfig) -> MadeFrom:
        settings = {
            "eval.harness_tasks": list(cfg.eval.harness_tasks),
            "eval.task_paths": list(cfg.eval.task_paths),
        }
        scored = ",".join(p.name for p in to_score(cfg)) or "(none)"
        return provenance.made_from(settings, train=TRAIN.fingerprint(cfg), checkpoints=scored)

    def marker(self, cfg: PipelineConfig) -> Path:
        return RunPaths.of(cfg.workdir).downstream_done

    def outputs(self, cfg: PipelineConfig) -> list[Path]:
        return [RunPaths.of(cfg.workdir).downstream_dir]

    def change(self, recorded: MadeFrom, now: MadeFrom) -> Change:
        return Change.REDO  # nothing is lost

    def make(self, cfg: PipelineConfig, made_from: MadeFrom) -> dict:
        from pipeline.evaluation.checkpoint_scoring import score  # torch: imported by the job

        paths = RunPaths.of(cfg.workdir)
        tasks = set(cfg.eval.harness_tasks)
        folders = to_score(cfg)
        # decided before any is scored: every rank of the job scores the same checkpoints
        earlier = [files.read_json_or_none(paths.downstream_result(f.name)) or {} for f in folders]
        for folder, record in zip(folders, earlier, strict=True):
            if not tasks <= set(record.get("tasks", {})):  # not scored while training went on
                score(cfg, folder)
        record = {"made_from": made_from, "checkpoints": [f.name for f in folders]}
        if distributed.from_env().is_first:
            files.write_json(paths.downstream_done, record)  # last: the marker
        return record


DOWNSTREAM = DownstreamStep()
