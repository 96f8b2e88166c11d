"""A sweep's comparison: sweep/summary.md tabulates each point's figures beside what sets it
apart (its overrides), and sweep/val_loss.png plots their validation curves."""

from __future__ import annotations

from pathlib import Path

from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.reporting.plots import pyplot, save_figure
from pipeline.reporting.summary import read_metrics


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
    curves = [read_metrics(RunPaths(folder)).validation for folder, _, _ in points]
    if not any(curves):
        return None
    fig, ax = pyplot().subplots(figsize=(7, 4), dpi=120)
    for (folder, _, _), varied, curve in zip(points, _varied(points), curves, strict=True):
        if curve:
            label = f"{folder.name}: {varied}" if varied else folder.name
            ax.plot([r["tokens"] for r in curve], [r["val_loss"] for r in curve], "o-", label=label)
    ax.set_xlabel("tokens")
    ax.set_ylabel("validation loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return save_figure(fig, sweep_dir / "val_loss.png")


def failed_points(sweep_dir: Path) -> list[tuple[Path, str]]:
    """(run folder, why) of each point whose last run failed (its sweep_point.json says)."""
    found = []
    for folder in sorted(p for p in sweep_dir.iterdir() if p.is_dir()):
        meta = files.read_json_or_none(folder / "sweep_point.json") or {}
        if meta.get("error"):
            found.append((folder, meta["error"]))
    return found


def write_sweep_summary(sweep_dir: Path) -> str:
    """sweep/summary.md: the table, the points that failed and why, and, once points have
    validated, their curves."""
    text = table(sweep_dir)
    failed = failed_points(sweep_dir)
    if failed:
        text += "\n\nFailed points:\n" + "\n".join(f"- {f.name}: {why}" for f, why in failed)
    if plot_validation(sweep_dir):
        text += "\n\n![validation loss of each point](val_loss.png)"
    files.write_text(sweep_dir / "summary.md", text + "\n")
    return text
