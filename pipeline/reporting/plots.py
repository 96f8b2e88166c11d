"""The run's plots, as PNG files written atomically: loss and throughput against tokens, and
test loss by checkpoint."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.reporting.summary import Metrics


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, target: Path) -> Path:
    with files.atomic_path(target) as tmp:
        fig.savefig(tmp, format="png", bbox_inches="tight")
    pyplot().close(fig)
    return target


def loss_series(metrics: Metrics) -> dict[str, list[tuple[int, int, float]]]:
    """(step, tokens, loss) of each curve of the loss plot: train, validation and, for a
    mixture, the validation loss of each source ("validation/NAME")."""
    series = {
        "train": [(r["step"], r["tokens"], r["loss"]) for r in metrics.train],
        "validation": [(r["step"], r["tokens"], r["val_loss"]) for r in metrics.validation],
    }
    names = sorted({k for r in metrics.validation for k in r if k.startswith("val_loss/")})
    for key in names:
        name = "validation/" + key.removeprefix("val_loss/")
        series[name] = [(r["step"], r["tokens"], r[key]) for r in metrics.validation if key in r]
    return series


def plot_losses(paths: RunPaths, metrics: Metrics) -> Path | None:
    """train/loss.png: training and validation loss against tokens seen; the plotted points
    are in train/loss.csv."""
    series = loss_series(metrics)
    if not series["train"]:
        return None
    table = io.StringIO()
    writer = csv.writer(table)
    writer.writerow(["series", "step", "tokens", "loss"])
    writer.writerows((name, *point) for name, points in series.items() for point in points)
    files.write_text(paths.train_dir / "loss.csv", table.getvalue())
    fig, ax = pyplot().subplots(figsize=(7, 4), dpi=120)
    for name, points in series.items():
        style = {"train": "-", "validation": "o-"}.get(name, ".--")  # a source's: dashed
        if points:
            ax.plot([p[1] for p in points], [p[2] for p in points], style, label=name)
    ax.set_xlabel("tokens")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, paths.train_dir / "loss.png")


def plot_throughput(paths: RunPaths, metrics: Metrics) -> Path | None:
    """train/throughput.png: tokens/s (and MFU, where the GPU's peak is known) over tokens."""
    if not metrics.train:
        return None
    fig, ax = pyplot().subplots(figsize=(7, 3.5), dpi=120)
    tokens = [r["tokens"] for r in metrics.train]
    ax.plot(tokens, [r["tokens_per_s"] for r in metrics.train], color="C0")
    ax.set_xlabel("tokens")
    ax.set_ylabel("tokens/s", color="C0")
    ax.grid(alpha=0.3)
    if all("mfu" in r for r in metrics.train):
        right = ax.twinx()
        right.plot(tokens, [100 * r["mfu"] for r in metrics.train], color="C1")
        right.set_ylabel("MFU (%)", color="C1")
    return save_figure(fig, paths.train_dir / "throughput.png")


def plot_checkpoints(paths: RunPaths, rows: list[dict]) -> Path | None:
    """eval/checkpoints.png: test (and validation) loss of every checkpoint kept, by step."""
    if not rows:
        return None
    fig, ax = pyplot().subplots(figsize=(7, 3.5), dpi=120)
    ax.plot([r["step"] for r in rows], [r["test_loss"] for r in rows], "o-", label="test")
    val = [r for r in rows if r["val_loss"] is not None]
    if val:
        ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "s--", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, paths.eval_dir / "checkpoints.png")
