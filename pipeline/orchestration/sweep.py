"""Hydra multirun sweeps: each point is its own run folder under `<workdir>/sweep/`, named by
its overrides (the same overrides, the same folder; other overrides, another folder), sharing
the tokenized data of the base run, and a table of the points when all have finished.

    python -m pipeline stages=[tokenize]                      # once: the shared data
    python -m pipeline -m hydra/launcher=submitit_slurm stages=[train,evaluate] \\
        train.hold_global_batch=true train.grad_accum=1,2,4
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from pipeline.config import PipelineConfig
from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.reporting.sweep_table import write_sweep_summary


def is_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def point_folder() -> str:
    """This point's run folder (hydra.sweep.subdir names it by its overrides)."""
    return HydraConfig.get().runtime.output_dir


def point_config(cfg: PipelineConfig) -> PipelineConfig:
    """A sweep point's config: its own workdir, the base run's data, its stages run right here
    (the point already is a job of its own)."""
    data = dataclasses.replace(cfg.data, prepared=cfg.data.prepared or cfg.workdir)
    cluster = dataclasses.replace(cfg.cluster, name="local", executor="inprocess")
    return dataclasses.replace(cfg, workdir=point_folder(), data=data, cluster=cluster)


def record_point(paths: RunPaths) -> None:
    """sweep_point.json: the point's overrides, which the sweep's table shows beside it."""
    files.write_json(paths.sweep_point, {"overrides": list(overrides())})


def overrides() -> list[str]:
    return list(HydraConfig.get().overrides.task)


class SweepSummary(Callback):
    """Writes <sweep dir>/summary.md when the launcher reports every point finished."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        text = write_sweep_summary(sweep_dir)
        print(f"\nSweep summary ({sweep_dir / 'summary.md'}):\n{text}")
