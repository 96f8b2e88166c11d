"""The report's downstream tasks: each scored checkpoint's metrics by step and trained tokens
(eval/downstream/*.json), and a plot of each task's scores against trained tokens."""

from __future__ import annotations

from pathlib import Path

from pipeline.core import scores
from pipeline.core.paths import RunPaths
from pipeline.reporting.plots import pyplot, save_figure


def series(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """(trained tokens, value) of each TASK/METRIC."""
    found: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        for name, value in scores.metrics(record).items():
            found.setdefault(name, []).append((record.get("tokens") or 0, value))
    return found


def plot_scores(paths: RunPaths, records: list[dict]) -> Path | None:
    """eval/downstream/scores.png: each task's metrics against trained tokens."""
    lines = series(records)
    if not lines:
        return None
    fig, ax = pyplot().subplots(figsize=(7, 3.5), dpi=120)
    for name, points in sorted(lines.items()):
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=name)
    ax.set_xlabel("trained tokens")
    ax.set_ylabel("score")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return save_figure(fig, paths.downstream_dir / "scores.png")


def downstream_blocks(paths: RunPaths) -> list[tuple]:
    records = scores.read(paths)
    if not records:
        return []
    names = sorted(series(records))
    rows = []
    for record in records:
        values = scores.metrics(record)
        cells = [f"{values[n]:.4f}" if n in values else "-" for n in names]
        rows.append((record["step"], record.get("tokens"), *cells))
    blocks = [
        ("h2", "Downstream tasks"),
        ("p", "Each scored checkpoint (eval/downstream/), by step and trained tokens:"),
        ("table", ("step", "trained tokens", *names), rows),
    ]
    plot = plot_scores(paths, records)
    if plot is not None:
        blocks.append(("img", plot.relative_to(paths.root), "downstream scores by tokens"))
    return blocks
