"""What a finished run says about itself: summary.json, and report.md / report.html with the
data, loss and throughput curves, test results, samples, job accounting and configuration,
all from what the stages recorded. Every file is written atomically."""

from __future__ import annotations

import csv
import html
import io
import json
from dataclasses import dataclass
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
    "wall_seconds",
    "gpu_hours",
)
SUMMARY_FROM_EVAL = ("test_loss", "test_ppl", "test_tokens", "checkpoint")


@dataclass(frozen=True)
class Metrics:
    train: list[dict]
    validation: list[dict]
    resumes: list[dict]


def read_metrics(layout: RunLayout) -> Metrics:
    """train/metrics.jsonl by kind. A step logged again by a later attempt (one that resumed
    from a checkpoint older than the last lines logged) replaces the earlier record."""
    if not layout.metrics.exists():
        return Metrics([], [], [])
    records = [json.loads(line) for line in layout.metrics.read_text().splitlines() if line]

    def last_per_step(key: str) -> list[dict]:
        by_step = {r["step"]: r for r in records if key in r}
        return [by_step[s] for s in sorted(by_step)]

    resumes = [r for r in records if "resumed_from" in r]
    return Metrics(last_per_step("loss"), last_per_step("val_loss"), resumes)


def write_summary(layout: RunLayout, evaluation: dict | None = None) -> dict:
    """Merge what the stages recorded into summary.json (stages that have not run are absent);
    `evaluation` is the evaluation's result before its marker is written."""
    summary: dict = {"workdir": str(layout.root)}
    manifest = files.read_json_or_none(layout.manifest)
    if manifest:
        summary["tokens"] = manifest["total"]["split_tokens"]["train"]
        summary["vocab_size"] = manifest["vocab_size"]
        summary["rejected_records"] = sum(manifest["total"]["rejected"].values())
    train = files.read_json_or_none(layout.train_done) or {}
    summary.update({k: train[k] for k in SUMMARY_FROM_TRAIN if k in train})
    summary["resumes"] = len(read_metrics(layout).resumes)
    if evaluation is None:
        evaluation = files.read_json_or_none(layout.eval_done) or {}
    summary.update({k: evaluation[k] for k in SUMMARY_FROM_EVAL if k in evaluation})
    if "sets" in evaluation:
        summary["set_ppl"] = {name: r["ppl"] for name, r in evaluation["sets"].items()}
    files.write_json(layout.summary, summary)
    return summary


# --- plots ------------------------------------------------------------------------------------


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
    """(step, tokens, loss) of each curve of the loss plot."""
    return {
        "train": [(r["step"], r["tokens"], r["loss"]) for r in metrics.train],
        "validation": [(r["step"], r["tokens"], r["val_loss"]) for r in metrics.validation],
    }


def plot_losses(layout: RunLayout, metrics: Metrics) -> Path | None:
    """train/loss.png: training and validation loss against tokens seen; the plotted points
    are in train/loss.csv."""
    series = loss_series(metrics)
    if not series["train"]:
        return None
    table = io.StringIO()
    writer = csv.writer(table)
    writer.writerow(["series", "step", "tokens", "loss"])
    writer.writerows((name, *point) for name, points in series.items() for point in points)
    files.write_text(layout.train_dir / "loss.csv", table.getvalue())
    fig, ax = pyplot().subplots(figsize=(7, 4), dpi=120)
    for (name, points), style in zip(series.items(), ("-", "o-"), strict=True):
        if points:
            ax.plot([p[1] for p in points], [p[2] for p in points], style, label=name)
    ax.set_xlabel("tokens")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, layout.train_dir / "loss.png")


def plot_throughput(layout: RunLayout, metrics: Metrics) -> Path | None:
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
    return save_figure(fig, layout.train_dir / "throughput.png")


def plot_checkpoints(layout: RunLayout, rows: list[dict]) -> Path | None:
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
    return save_figure(fig, layout.eval_dir / "checkpoints.png")


# --- the report: blocks rendered to Markdown and to HTML ------------------------------------
# ("h2" or "h3", title) | ("p", text) | ("table", header, rows) | ("img", path, alt)
# | ("code", text, language)


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def _short(value: object) -> object:
    return f"{value:.6g}" if isinstance(value, float) else value


def _kv(pairs: list[tuple[str, object]]) -> tuple:
    return ("table", ("", ""), pairs)


def _seconds(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:,.1f} s" if s < 3600 else f"{s / 3600:,.2f} h"


def _data_section(manifest: dict) -> list[tuple]:
    total = manifest.get("total", {})
    splits = total.get("split_tokens", {})
    rejected = total.get("rejected", {})
    return [
        ("h2", "Data"),
        _kv(
            [
                ("documents", total.get("documents")),
                ("tokens", total.get("tokens")),
                (
                    "train / validation / test tokens",
                    " / ".join(str(splits.get(k)) for k in ("train", "validation", "test")),
                ),
                ("shards", len(manifest.get("shards", []))),
                ("rejected records", ", ".join(f"{k}: {v}" for k, v in rejected.items()) or 0),
                ("vocabulary", manifest.get("vocab_size")),
                ("tokenizer", manifest.get("tokenizer")),
            ]
        ),
    ]


def _training_section(layout: RunLayout, summary: dict, metrics: Metrics) -> list[tuple]:
    shown = [k for k in SUMMARY_FROM_TRAIN if k not in ("tokens", "vocab_size")]
    blocks = [("h2", "Training"), _kv([(k, _short(summary.get(k))) for k in shown])]
    plot = plot_losses(layout, metrics)
    if plot:
        series = loss_series(metrics)
        blocks += [
            ("img", plot.relative_to(layout.root), "loss curves"),
            (
                "p",
                f"Loss against tokens seen: train ({len(series['train'])} points) and validation "
                f"({len(series['validation'])} points); the plotted data is in train/loss.csv.",
            ),
        ]
    throughput = plot_throughput(layout, metrics)
    if throughput:
        rows = [
            (
                r["step"],
                r["tokens"],
                f"{r['tokens_per_s']:,.0f}",
                f"{r['tflops_per_gpu']:.2f}",
                f"{100 * r['mfu']:.1f}%" if "mfu" in r else "-",
            )
            for r in metrics.train[:: max(1, len(metrics.train) // 10)]
        ]
        blocks += [
            ("img", throughput.relative_to(layout.root), "throughput"),
            (
                "p",
                "Throughput over time (MFU with Megatron's FLOP formula, where the peak is known):",
            ),
            ("table", ("step", "tokens", "tokens/s", "TFLOP/s/GPU", "MFU"), rows),
        ]
    return blocks


def _results_section(layout: RunLayout, evaluation: dict) -> list[tuple]:
    blocks = [("h2", "Test results"), _kv([(k, evaluation.get(k)) for k in SUMMARY_FROM_EVAL])]
    sets = evaluation.get("sets", {})
    if sets:
        rows = [
            (
                name,
                r["documents"],
                r["tokens"],
                f"{r['loss']:.4f}",
                f"{r['ppl']:.2f}",
                sum(r["rejected"].values()) if "rejected" in r else "-",
            )
            for name, r in sets.items()
        ]
        blocks += [
            ("p", "Every set, by the same checkpoint (test: the held-out split):"),
            (
                "table",
                ("set", "documents", "tokens", "loss", "perplexity", "rejected records"),
                rows,
            ),
        ]
    checkpoints = evaluation.get("checkpoints", [])
    if checkpoints:
        best = Path(evaluation["checkpoint"]).name
        rows = [
            (
                r["step"] if r["checkpoint"] != best else f"{r['step']} (evaluated above)",
                "-" if r["val_loss"] is None else f"{r['val_loss']:.4f}",
                f"{r['test_loss']:.4f}",
                f"{r['test_ppl']:.2f}",
            )
            for r in checkpoints
        ]
        plot = plot_checkpoints(layout, checkpoints)
        blocks += [
            ("h2", "Every checkpoint kept"),
            ("table", ("step", "validation loss", "test loss", "test perplexity"), rows),
            ("img", plot.relative_to(layout.root), "test loss by checkpoint"),
        ]
    harness = evaluation.get("harness", {})
    if harness:
        blocks.append(("h2", "Downstream tasks (lm-evaluation-harness)"))
        if "skipped" in harness:
            blocks.append(("p", harness["skipped"]))
        else:
            rows = [
                (task, metric, f"{value:.4f}")
                for task, metrics in harness["results"].items()
                for metric, value in metrics.items()
            ]
            blocks.append(("table", ("task", "metric", "value"), rows))
    return blocks


def _samples_section(evaluation: dict) -> list[tuple]:
    samples = evaluation.get("samples", [])
    if not samples:
        return []
    blocks = [
        ("h2", "Samples"),
        ("p", "Continuations of each prompt, decoded with the run's tokenizer."),
    ]
    for s in samples:
        blocks += [
            ("h3", s["prompt"]),
            ("p", "greedy:"),
            ("code", s["greedy"], "text"),
            ("p", "top-k / top-p:"),
            ("code", s["sampled"], "text"),
        ]
    return blocks


def job_accounting(layout: RunLayout, evaluation: dict) -> list[tuple[str, float | None, str]]:
    """(step, wall seconds, note) for each step of the graph, from its completion marker."""
    tokenizer = files.read_json_or_none(layout.tokenizer_dir / "tokenizer.json") or {}
    manifest = files.read_json_or_none(layout.manifest) or {}
    shards = manifest.get("tokenized_shards", [])
    index = files.read_json_or_none(layout.index_done) or {}
    train = files.read_json_or_none(layout.train_done) or {}
    return [
        ("tokenizer", tokenizer.get("seconds"), "trained" if tokenizer.get("trained") else ""),
        (
            "tokenize",
            sum(s["seconds"] for s in shards) if shards else None,
            f"{len(shards)} array tasks, their times summed",
        ),
        ("verify", manifest.get("total", {}).get("verify_seconds"), ""),
        ("index", index.get("seconds"), "megatron-core dataset index cache"),
        ("train", train.get("wall_seconds"), "all attempts, each up to its last checkpoint"),
        ("evaluate", evaluation.get("seconds"), ""),
    ]


def _jobs_section(layout: RunLayout, evaluation: dict, metrics: Metrics) -> list[tuple]:
    rows = [(step, _seconds(s), note) for step, s, note in job_accounting(layout, evaluation)]
    train = files.read_json_or_none(layout.train_done) or {}
    eval_hours = evaluation.get("gpus", 0) * (evaluation.get("seconds") or 0) / 3600
    train_hours = train.get("gpu_hours", 0.0)
    resumes = metrics.resumes
    jobs = files.read_json_or_none(layout.jobs) or []
    return [
        ("h2", "Jobs"),
        ("table", ("step", "wall time", "note"), rows),
        _kv(
            [
                ("training GPUs", train.get("gpus")),
                ("GPU hours: training", f"{train_hours:.3f}"),
                ("GPU hours: evaluation", f"{eval_hours:.3f}"),
                ("GPU hours: total", f"{train_hours + eval_hours:.3f}"),
                (
                    "training resumed (requeues, reruns)",
                    f"{len(resumes)}"
                    + "".join(f"; from {r['resumed_from']}" for r in resumes[:10]),
                ),
                ("Slurm submissions", len(jobs) if jobs else "none: run locally"),
            ]
        ),
    ]


def report_blocks(layout: RunLayout, evaluation: dict) -> list[tuple]:
    summary = write_summary(layout, evaluation)
    manifest = files.read_json_or_none(layout.manifest) or {}
    metrics = read_metrics(layout)
    config = layout.config.read_text() if layout.config.exists() else ""
    return [
        *_data_section(manifest),
        *_training_section(layout, summary, metrics),
        *_results_section(layout, evaluation),
        *_samples_section(evaluation),
        *_jobs_section(layout, evaluation, metrics),
        ("h2", "Configuration"),
        ("code", config.rstrip(), "yaml"),
    ]


def to_markdown(title: str, blocks: list[tuple]) -> str:
    def row(cells) -> str:
        text = (_cell(c).replace("|", "\\|").replace("\n", "<br>") for c in cells)
        return "| " + " | ".join(text) + " |"

    lines = [f"# {title}", ""]
    for kind, *args in blocks:
        if kind in ("h2", "h3"):
            lines += [f"{'#' * int(kind[1])} {args[0]}", ""]
        elif kind == "p":
            lines += [args[0], ""]
        elif kind == "table":
            header, rows = args
            lines += [row(header), "|" + "---|" * len(header), *map(row, rows), ""]
        elif kind == "img":
            lines += [f"![{args[1]}]({args[0]})", ""]
        elif kind == "code":
            fence = "````" if "```" in args[0] else "```"
            lines += [f"{fence}{args[1]}", args[0], fence, ""]
    return "\n".join(lines)


STYLE = (
    "body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
    "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .6em;"
    "text-align:left;vertical-align:top;white-space:pre-wrap}img{max-width:100%}"
    "pre{background:#f6f6f6;padding:1em;overflow-x:auto}"
)


def to_html(title: str, blocks: list[tuple]) -> str:
    e = html.escape
    parts = [f"<!doctype html><meta charset='utf-8'><title>{e(title)}</title>"]
    parts += [f"<style>{STYLE}</style>", f"<h1>{e(title)}</h1>"]
    for kind, *args in blocks:
        if kind in ("h2", "h3"):
            parts.append(f"<{kind}>{e(args[0])}</{kind}>")
        elif kind == "p":
            parts.append(f"<p>{e(args[0])}</p>")
        elif kind == "table":
            header, rows = args
            head = "".join(f"<th>{e(_cell(c))}</th>" for c in header)
            body = "".join(
                "<tr>" + "".join(f"<td>{e(_cell(c))}</td>" for c in r) + "</tr>" for r in rows
            )
            parts.append(f"<table><tr>{head}</tr>{body}</table>")
        elif kind == "img":
            parts.append(f'<p><img src="{e(str(args[0]))}" alt="{e(args[1])}"></p>')
        elif kind == "code":
            parts.append(f"<pre>{e(args[0])}</pre>")
    return "\n".join(parts) + "\n"


def write_report(layout: RunLayout, evaluation: dict | None = None) -> Path:
    """report.md and report.html in the run folder; `evaluation` as in write_summary."""
    if evaluation is None:
        evaluation = files.read_json_or_none(layout.eval_done) or {}
    blocks = report_blocks(layout, evaluation)
    title = f"Run report: {layout.root.name}"
    files.write_text(layout.root / "report.md", to_markdown(title, blocks))
    files.write_text(layout.root / "report.html", to_html(title, blocks))
    return layout.root / "report.md"
