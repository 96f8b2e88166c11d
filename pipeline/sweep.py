"""Hydra multirun sweeps: each point is its own run folder under `<workdir>/sweep/`, sharing
the tokenized data of the base run, and a table of the points when all have finished.

    python -m pipeline stages=[tokenize]                      # once: the shared data
    python -m pipeline -m hydra/launcher=submitit_slurm stages=[train,evaluate] \\
        train.hold_global_batch=true train.grad_accum=1,2,4
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, open_dict

from pipeline import files

SHARED = ("corpus", "tokenizer", "data")


def is_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def point_config(cfg: DictConfig) -> DictConfig:
    """A sweep point's config: its own workdir, the base run's data, its stages run right here
    (the point already is a job of its own)."""
    base = cfg.workdir
    point = Path(HydraConfig.get().runtime.output_dir)
    files.write_json(
        point / "sweep_point.json", {"overrides": list(HydraConfig.get().overrides.task)}
    )
    with open_dict(cfg):
        cfg.workdir = HydraConfig.get().runtime.output_dir
        cfg.data.prepared = cfg.data.prepared or base
        cfg.cluster.name = "local"
        cfg.cluster.executor = "inprocess"
    return cfg


def link_prepared_data(cfg: DictConfig) -> None:
    """Link the prepared run's corpus, tokenizer and data folders into this run."""
    source = Path(cfg.data.prepared).expanduser().resolve()
    target = Path(cfg.workdir).expanduser().resolve()
    target.mkdir(parents=True, exist_ok=True)
    for name in SHARED:
        link = target / name
        if not link.exists() and (source / name).exists():
            os.symlink(source / name, link)


def table(sweep_dir: Path) -> str:
    """Markdown table of the points: what differs between them, throughput and losses."""
    points = []
    for folder in sorted((p for p in sweep_dir.iterdir() if p.is_dir()), key=lambda p: p.name):
        meta = files.read_json_or_none(folder / "sweep_point.json")
        if meta is not None:
            points.append(
                (folder, meta["overrides"], files.read_json_or_none(folder / "summary.json") or {})
            )
    common = set.intersection(*(set(o) for _, o, _ in points)) if points else set()

    def number(summary: dict, key: str, fmt: str) -> str:
        return format(summary[key], fmt) if summary.get(key) is not None else "-"

    rows = [
        "| point | overrides | tokens/s | final train loss | best val loss | test loss |",
        "|---|---|---|---|---|---|",
    ]
    for folder, overrides, s in points:
        varied = " ".join(o for o in overrides if o not in common)
        rows.append(
            f"| {folder.name} | {varied} | {number(s, 'tokens_per_s', ',.0f')} | "
            f"{number(s, 'last_train_loss', '.4f')} | {number(s, 'best_val_loss', '.4f')} | "
            f"{number(s, 'test_loss', '.4f')} |"
        )
    return "\n".join(rows)


class SweepSummary(Callback):
    """Writes <sweep dir>/summary.md when the launcher reports every point finished."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        text = table(sweep_dir)
        files.write_text(sweep_dir / "summary.md", text + "\n")
        print(f"\nSweep summary ({sweep_dir / 'summary.md'}):\n{text}")
