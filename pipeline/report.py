"""What a finished run says about itself: summary.json in the run folder."""

from __future__ import annotations

from pathlib import Path

from pipeline import files
from pipeline.layout import RunLayout

SUMMARY_FROM_TRAIN = (
    "tokens",
    "vocab_size",
    "train_steps",
    "trained_tokens",
    "first_train_loss",
    "last_train_loss",
    "best_val_loss",
    "tokens_per_s",
    "best_checkpoint",
    "skipped_steps",
)
SUMMARY_FROM_EVAL = ("test_loss", "test_ppl", "test_tokens", "checkpoint")


def write_summary(layout: RunLayout) -> dict:
    """Merge what the stages recorded into summary.json (stages that have not run are absent)."""
    summary: dict = {"workdir": str(layout.root)}
    manifest = files.read_json_or_none(layout.manifest)
    if manifest:
        summary["tokens"] = manifest["total"]["split_tokens"]["train"]
        summary["vocab_size"] = manifest["vocab_size"]
        summary["rejected_records"] = sum(manifest["total"]["rejected"].values())
    train = files.read_json_or_none(layout.train_done) or {}
    summary.update({k: train[k] for k in SUMMARY_FROM_TRAIN if k in train})
    evaluation = files.read_json_or_none(layout.eval_done) or {}
    summary.update({k: evaluation[k] for k in SUMMARY_FROM_EVAL if k in evaluation})
    files.write_json(layout.summary, summary)
    return summary


def _metrics(layout: RunLayout) -> tuple[list[dict], list[dict]]:
    import json

    if not layout.metrics.exists():
        return [], []
    records = [json.loads(line) for line in layout.metrics.read_text().splitlines() if line]
    return [r for r in records if "loss" in r], [r for r in records if "val_loss" in r]


def plot_losses(layout: RunLayout) -> Path | None:
    """train/loss.png: training and validation loss against tokens seen."""
    train, val = _metrics(layout)
    if not train:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.plot([r["tokens"] for r in train], [r["loss"] for r in train], label="train")
    if val:
        ax.plot([r["tokens"] for r in val], [r["val_loss"] for r in val], "o-", label="validation")
    ax.set_xlabel("tokens")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    target = layout.train_dir / "loss.png"
    with files.atomic_path(target) as tmp:
        fig.savefig(tmp, format="png", bbox_inches="tight")
    plt.close(fig)
    return target


def _table(rows: list[tuple[str, object]]) -> list[str]:
    return ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]


def write_report(layout: RunLayout) -> Path:
    """report.md and report.html: configuration, data, curves, throughput, test results,
    samples and job accounting, from what the stages recorded."""
    import html

    summary = write_summary(layout)
    manifest = files.read_json_or_none(layout.manifest) or {}
    evaluation = files.read_json_or_none(layout.eval_done) or {}
    train, _ = _metrics(layout)
    plot = plot_losses(layout)
    lines = [f"# Run report: {layout.root.name}", ""]
    config = layout.config.read_text() if layout.config.exists() else ""
    total = manifest.get("total", {})
    lines += ["## Data", ""] + _table(
        [
            ("documents", total.get("documents")),
            ("tokens", total.get("tokens")),
            (
                "train / validation / test tokens",
                " / ".join(
                    str(total.get("split_tokens", {}).get(k))
                    for k in ("train", "validation", "test")
                ),
            ),
            ("rejected records", total.get("rejected")),
            ("vocabulary", manifest.get("vocab_size")),
        ]
    )
    lines += ["", "## Training", ""] + _table(
        [(k, summary.get(k)) for k in SUMMARY_FROM_TRAIN if k not in ("tokens", "vocab_size")]
    )
    if plot:
        lines += ["", f"![loss curves]({plot.relative_to(layout.root)})"]
    if train:
        lines += [
            "",
            "Throughput over time:",
            "",
            "| step | tokens/s | TFLOP/s/GPU | MFU |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {r['step']} | {r['tokens_per_s']:,.0f} | {r['tflops_per_gpu']:.2f} | "
            f"{100 * r['mfu']:.1f}% |"
            if "mfu" in r
            else f"| {r['step']} | {r['tokens_per_s']:,.0f} | {r['tflops_per_gpu']:.2f} | - |"
            for r in train[:: max(1, len(train) // 10)]
        ]
    lines += ["", "## Test results", ""] + _table(
        [(k, evaluation.get(k)) for k in SUMMARY_FROM_EVAL]
    )
    if evaluation.get("samples"):
        lines += ["", "## Samples", ""]
        for s in evaluation["samples"]:
            lines += [
                f"**{s['prompt']}**",
                "",
                f"- greedy: {s['greedy']!r}",
                f"- top-k/top-p: {s['sampled']!r}",
                "",
            ]
    jobs = files.read_json_or_none(layout.jobs) or []
    lines += ["", "## Jobs", "", f"{len(jobs)} submission(s) to Slurm" if jobs else "run locally"]
    lines += ["", "## Configuration", "", "```yaml", config.rstrip(), "```", ""]
    text = "\n".join(lines)
    files.write_text(layout.root / "report.md", text)
    body = "".join(f"<p>{html.escape(line)}</p>\n" if line else "" for line in lines)
    if plot:
        body = body.replace(
            html.escape(f"![loss curves]({plot.relative_to(layout.root)})"),
            f'<img src="{plot.relative_to(layout.root)}" alt="loss curves">',
        )
    files.write_text(
        layout.root / "report.html",
        f"<!doctype html><meta charset='utf-8'><title>{layout.root.name}</title>\n{body}",
    )
    return layout.root / "report.md"
