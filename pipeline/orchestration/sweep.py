"""Hydra multirun sweeps: each point is its own run folder under `<workdir>/sweep/`, sharing
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
from pipeline.reporting.sweep_table import write_sweep_summary


def is_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def point_config(cfg: PipelineConfig) -> PipelineConfig:
    """A sweep point's config: its own workdir, the base run's data, its stages run right here
    (the point already is a job of its own). Records the point's overrides in its folder."""
    hydra = HydraConfig.get()
    point = hydra.runtime.output_dir
    files.write_json(Path(point) / "sweep_point.json", {"overrides": list(hydra.overrides.task)})
    data = dataclasses.replace(cfg.data, prepared=cfg.data.prepared or cfg.workdir)
    cluster = dataclasses.replace(cfg.cluster, name="local", executor="inprocess")
    return dataclasses.replace(cfg, workdir=point, data=data, cluster=cluster)


class SweepSummary(Callback):
    """Writes <sweep dir>/summary.md when the launcher reports every point finished."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        text = write_sweep_summary(sweep_dir)
        print(f"\nSweep summary ({sweep_dir / 'summary.md'}):\n{text}")
