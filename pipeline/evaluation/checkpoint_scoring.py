"""The body of a downstream job: one checkpoint scored on eval.harness_tasks (through
pipeline.evaluation.downstream), offline, from the tasks' data cache. Its scores go to
eval/downstream/<checkpoint>.json, summary.json and the report, and into the run's trackers at
the checkpoint's step (TensorBoard under train/tensorboard/downstream, W&B, MLflow). The lease
that kept the checkpoint from retention is released at the end, scored or not."""

from __future__ import annotations

import time
from pathlib import Path

from pipeline.config import PipelineConfig
from pipeline.core import files, log, scores
from pipeline.core.paths import RunPaths
from pipeline.reporting.report import write_report
from pipeline.runtime import distributed
from pipeline.tracking.trackers import Trackers
from pipeline.training import leases

_log = log.get()


def score(cfg: PipelineConfig, folder: Path) -> dict:
    """Score the checkpoint `folder` and record its scores everywhere they are read."""
    paths = RunPaths.of(cfg.workdir)
    failure = paths.downstream_failure(folder.name)
    try:
        try:
            from pipeline.evaluation.downstream import score_checkpoint  # torch: in the job

            record = score_checkpoint(cfg, folder, paths.downstream_result(folder.name))
        except BaseException as e:  # what `make status` says of this checkpoint's job
            error = (f"{type(e).__name__}: {e}".strip().splitlines() or [""])[0]
            files.write_json(failure, {"at": time.strftime("%Y-%m-%dT%H:%M:%S"), "error": error})
            raise
        values = flat(record)  # the same on every rank: the line comes from the one that logs
        _log.info(
            f"downstream: {folder.name} (step {record['step']}): "
            + ", ".join(f"{k} {v:.4f}" for k, v in values.items())
        )
        if not distributed.from_env().is_first:  # the job's other ranks scored beside it
            return record
        failure.unlink(missing_ok=True)
        _to_trackers(cfg, paths, record["step"], values)
        write_report(paths)  # and summary.json, which gathers every checkpoint's scores
        return record
    finally:
        if distributed.from_env().is_first:
            leases.release(folder)


def flat(record: dict) -> dict[str, float]:
    """{"downstream/TASK/METRIC": value} of a record's scores, as the trackers get them: the
    harness's default filter left out of the name (acc,none is acc), another one joined by _
    (MLflow refuses a comma in a metric's name)."""
    return {
        f"downstream/{name.removesuffix(',none').replace(',', '_')}": value
        for name, value in scores.metrics(record).items()
    }


def _to_trackers(cfg: PipelineConfig, paths: RunPaths, step: int, values: dict) -> None:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # as training: no TensorBoard without its package
        SummaryWriter = None
    if SummaryWriter is not None:
        writer = SummaryWriter(str(paths.tensorboard / "downstream"))
        for key, value in values.items():
            writer.add_scalar(key, value, step)
        writer.close()
    trackers = Trackers.open(cfg, paths)  # the training's tracker runs, continued
    trackers.log({"step": step, **values})
    trackers.finish(artifacts=False)
