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

from pipeline import files, report
from pipeline.layout import RunLayout

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


def _points(sweep_dir: Path) -> list[tuple[Path, list[str], dict]]:
    """(run folder, overrides, summary) of each point, in point order."""
    points = []
    for folder in sorted(
        (p for p in sweep_dir.iterdir() if p.is_dir()), key=lambda p: (len(p.name), p.name)
    ):
        meta = files.read_json_or_none(folder / "sweep_point.json")
        if meta is not None:
            points.append(
                (folder, meta["overrides"], files.read_json_or_none(folder / "summary.json") or {})
            )
    return points


def _varied(points: list[tuple[Path, list[str], dict]]) -> list[str]:
    """What sets each point apart: its overrides less those all points share."""
    common = set.intersection(*(set(o) for _, o, _ in points)) if points else set()
    return [" ".join(o for o in overrides if o not in common) for _, overrides, _ in points]


def table(sweep_dir: Path) -> str:
    """Markdown table of the points: what differs between them, throughput and losses."""
    points = _points(sweep_dir)

    def number(summary: dict, key: str, fmt: str) -> str:
        return format(summary[key], fmt) if summary.get(key) is not None else "-"

    rows = [
        "| point | overrides | tokens/s | final train loss | best val loss | test loss | test ppl |",
        "|---|---|---|---|---|---|---|",
    ]
    for (folder, _, s), varied in zip(points, _varied(points), strict=True):
        rows.append(
            f"| {folder.name} | {varied} | {number(s, 'tokens_per_s', ',.0f')} | "
            f"{number(s, 'last_train_loss', '.4f')} | {number(s, 'best_val_loss', '.4f')} | "
            f"{number(s, 'test_loss', '.4f')} | {number(s, 'test_ppl', '.2f')} |"
        )
    return "\n".join(rows)


def plot_validation(sweep_dir: Path) -> Path | None:
    """sweep/val_loss.png: every point's validation loss against tokens seen."""
    points = _points(sweep_dir)
    curves = [report.read_metrics(RunLayout(folder)).validation for folder, _, _ in points]
    if not any(curves):
        return None
    fig, ax = report.pyplot().subplots(figsize=(7, 4), dpi=120)
    for (folder, _, _), varied, curve in zip(points, _varied(points), curves, strict=True):
        if curve:
            label = f"{folder.name}: {varied}" if varied else folder.name
            ax.plot([r["tokens"] for r in curve], [r["val_loss"] for r in curve], "o-", label=label)
    ax.set_xlabel("tokens")
    ax.set_ylabel("validation loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return report.save_figure(fig, sweep_dir / "val_loss.png")


def write_summary(sweep_dir: Path) -> str:
    """sweep/summary.md: the table and, once points have validated, their curves."""
    text = table(sweep_dir)
    if plot_validation(sweep_dir):
        text += "\n\n![validation loss of each point](val_loss.png)"
    files.write_text(sweep_dir / "summary.md", text + "\n")
    return text


class SweepSummary(Callback):
    """Writes <sweep dir>/summary.md when the launcher reports every point finished."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        text = write_summary(sweep_dir)
        print(f"\nSweep summary ({sweep_dir / 'summary.md'}):\n{text}")
