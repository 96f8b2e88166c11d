"""Hydra multirun sweeps: each point is its own run folder under `<workdir>/sweep/`, named by
its overrides (the same overrides, the same folder; other overrides, another folder), sharing
the tokenized data of the base run, and a table of the points when all have finished.

    python -m pipeline stages=[tokenize]                      # once: the shared data
    python -m pipeline -m hydra/launcher=submitit_slurm stages=[train,evaluate] \\
        train.hold_global_batch=true train.grad_accum=1,2,4
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from pipeline.config import PipelineConfig
from pipeline.config.compose import sweep_point_folder
from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.reporting.sweep_table import failed_points, write_sweep_summary


def is_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def point_folder() -> str:
    """This point's run folder (hydra.sweep.subdir names it by its overrides)."""
    return HydraConfig.get().runtime.output_dir


def base_run() -> RunPaths:
    """The run a sweep's points start from: the workdir whose sweep/ folder holds them."""
    return RunPaths.of(Path(point_folder()).parent.parent)


def point_config(cfg: PipelineConfig, point: list[str] | None = None) -> PipelineConfig:
    """A sweep point's config: its own workdir, the base run's data, its stages run right here
    (the point already is a job of its own). `point`: the overrides of a point not yet
    running (its folder as Hydra will name it)."""
    data = dataclasses.replace(cfg.data, prepared=cfg.data.prepared or cfg.workdir)
    cluster = dataclasses.replace(cfg.cluster, name="local", executor="inprocess")
    if point is None:
        folder = point_folder()
    else:  # hydra.sweep.subdir of conf/config.yaml, from Hydra's override_dirname
        folder = str(Path(cfg.workdir) / "sweep" / sweep_point_folder(",".join(sorted(point))))
    return dataclasses.replace(cfg, workdir=folder, data=data, cluster=cluster)


def record_point(paths: RunPaths) -> None:
    """sweep_point.json: the point's overrides, which the sweep's table shows beside it."""
    files.write_json(paths.sweep_point, {"overrides": list(overrides())})


def record_failure(paths: RunPaths, message: str) -> None:
    """sweep_point.json of a point that failed: its overrides and why, for the table."""
    files.write_json(paths.sweep_point, {"overrides": list(overrides()), "error": message})


def points(args: list[str]) -> list[list[str]]:
    """The overrides of each point of a sweep over `args` (KEY=A,B: a point for each value),
    in the order Hydra's basic sweeper runs them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(args)
    return BasicSweeper.split_arguments(parsed, None)[0]


def overrides() -> list[str]:
    return list(HydraConfig.get().overrides.task)


class SweepSummary(Callback):
    """Writes <sweep dir>/summary.md when the launcher reports every point finished (a point
    that failed is in it, and the sweep exits 1)."""

    started = 0.0

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.started = time.time()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        text = write_sweep_summary(sweep_dir)
        print(f"\nSweep summary ({sweep_dir / 'summary.md'}):\n{text}")
        failed = [f for f, _ in failed_points(sweep_dir) if _changed_since(f, self.started)]
        if failed:  # points of this sweep
            sys.exit(1)


def _changed_since(folder: Path, started: float) -> bool:
    return (folder / "sweep_point.json").stat().st_mtime >= started
