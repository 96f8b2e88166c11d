"""`python -m pipeline.score RUN_FOLDER CHECKPOINT`: score one checkpoint of a run on its
eval.harness_tasks, with the settings the training ran with. The training job starts it,
detached, for every eval.harness_every-th checkpoint it keeps, and does not wait: on a local
run it scores the checkpoint itself (in as many local processes as the training's tensor x
pipeline ranks, when those are more than one); on Slurm it submits a job that does, names that
job in the checkpoint's lease, and exits."""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline import config
from pipeline.core import log
from pipeline.core.errors import ConfigError, StageError
from pipeline.core.paths import RunPaths

_log = log.get("pipeline")


def score(root: Path, name: str) -> None:
    paths = RunPaths.of(root)
    saved = paths.train_config if paths.train_config.exists() else paths.config
    if not saved.exists():
        raise ConfigError(f"{root}: no train/config.yaml nor config.yaml: not a run folder")
    cfg = config.read(saved)
    folder = paths.checkpoints / name
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such checkpoint")
    if cfg.cluster.executor == "slurm":
        from pipeline.orchestration.executors.slurm import submit_scoring
        from pipeline.training import leases

        job = submit_scoring(cfg, folder)
        leases.name_job(folder, job)
        _log.info(f"downstream {name}: submitted job {job}")
        return
    from pipeline.evaluation.downstream_step import DOWNSTREAM
    from pipeline.orchestration.executors.base import resources

    if resources(DOWNSTREAM, cfg).ranks > 1:  # a model trained in parallel: as many ranks here
        from pipeline.orchestration.executors.subprocesses import score_in_ranks

        score_in_ranks(cfg, folder)
        return
    from pipeline.evaluation.checkpoint_scoring import score as score_here

    score_here(cfg, folder)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m pipeline.score RUN_FOLDER CHECKPOINT", file=sys.stderr)
        return 2
    try:
        score(Path(argv[0]), argv[1])
    except ConfigError as e:
        _log.error(f"error: {e}")
        return 2
    except StageError as e:  # the scoring ranks' job failed: its error and log, in one line
        _log.error(f"error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
