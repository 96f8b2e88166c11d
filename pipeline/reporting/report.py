"""report.md and report.html: the data, the launcher's plan, the loss and throughput curves,
test results, samples, job accounting and configuration of a run, all from what its steps and
its launch recorded. Every file is written atomically."""

from __future__ import annotations

import html
from pathlib import Path

from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.reporting.downstream_section import downstream_blocks
from pipeline.reporting.plan_section import plan_blocks
from pipeline.reporting.plots import loss_series, plot_checkpoints, plot_losses, plot_throughput
from pipeline.reporting.router_section import router_blocks
from pipeline.reporting.summary import (
    SUMMARY_FROM_EVAL,
    SUMMARY_FROM_TRAIN,
    Metrics,
    current_evaluation,
    read_failures,
    read_metrics,
    read_stragglers,
    write_summary,
)

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


def _data_section(manifest: dict, weights: dict[str, float]) -> list[tuple]:
    total = manifest.get("total", {})
    splits = total.get("split_tokens", {})
    rejected = total.get("rejected", {})
    blocks = [
        ("h2", "Data"),
        _kv(
            [
                ("documents", total.get("documents")),
                ("tokens of all splits", sum(splits.values()) if splits else None),
                (
                    "train / validation / test tokens",
                    " / ".join(str(splits.get(k)) for k in ("train", "validation", "test")),
                ),
                (
                    "split",
                    f"{manifest.get('split')} by a hash of each document's text "
                    f"(data.split_seed={manifest.get('split_seed')})",
                ),
                ("shards", len(manifest.get("shards", []))),
                ("rejected records", ", ".join(f"{k}: {v}" for k, v in rejected.items()) or 0),
                *(
                    [("records lost to damaged files (predicted)", total["predicted_lost"])]
                    if total.get("predicted_lost")
                    else []
                ),
                *(
                    [("rows left out by row filters", total["filtered"])]
                    if total.get("filtered")
                    else []
                ),
                (
                    "duplicates removed",
                    f"{total.get('duplicates', {}).get('documents', 0)} documents "
                    f"(data.dedup={manifest.get('dedup')})",
                ),
                ("vocabulary", manifest.get("vocab_size")),
                ("tokenizer", manifest.get("tokenizer")),
            ]
        ),
    ]
    described = manifest.get("sources", {})
    if len(described) > 1:
        rows = [
            (
                name,
                f"{100 * weights[name]:.1f}%" if name in weights else "-",
                s["documents"],
                " / ".join(str(s["split_tokens"][k]) for k in ("train", "validation", "test")),
                sum(s["rejected"].values()),
                s["duplicates"]["documents"],
            )
            for name, s in described.items()
        ]
        header = ("source", "share of samples", "documents", "train / validation / test tokens")
        blocks.append(("table", (*header, "rejected", "duplicates removed"), rows))
    return blocks


def _training_section(paths: RunPaths, summary: dict, metrics: Metrics) -> list[tuple]:
    shown = ["train_split_tokens", *(k for k in SUMMARY_FROM_TRAIN if k != "vocab_size")]
    blocks = [("h2", "Training"), _kv([(k, _short(summary.get(k))) for k in shown])]
    plot = plot_losses(paths, metrics)
    if plot:
        series = loss_series(metrics)
        caption = (
            f"Loss against tokens seen: train ({len(series['train'])} points) and validation "
            f"({len(series['validation'])} points)"
        )
        sources = [name.split("/", 1)[1] for name in series if name.startswith("validation/")]
        if sources:
            caption += (
                f", the sources' losses weighted by their shares, and each of {', '.join(sources)}"
            )
        blocks += [
            ("img", plot.relative_to(paths.root), "loss curves"),
            ("p", caption + "; the plotted data is in train/loss.csv."),
        ]
    throughput = plot_throughput(paths, metrics)
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
            ("img", throughput.relative_to(paths.root), "throughput"),
            (
                "p",
                "Throughput over time (MFU with Megatron's FLOP formula, where the peak is known):",
            ),
            ("table", ("step", "tokens", "tokens/s", "TFLOP/s/GPU", "MFU"), rows),
        ]
    return blocks + _checkpoints_section(metrics)


def _checkpoints_section(metrics: Metrics) -> list[tuple]:
    """Each save's cost to training, and each resume's load time."""
    if not metrics.saves and not metrics.resumes:
        return []
    rows = [
        (r["step"], f"{r['checkpoint_blocked_s']:.2f} s", f"{r['checkpoint_total_s']:.2f} s")
        for r in metrics.saves
    ]
    loads = [
        f"from {r['resumed_from']} in {r['resume_load_s']:.1f} s"
        + (f" (checksums {r['resume_verify_s']:.1f} s)" if "resume_verify_s" in r else "")
        for r in metrics.resumes
        if "resume_load_s" in r
    ]
    blocks = [
        ("h3", "Checkpoints"),
        (
            "p",
            "For each save, how long the training loop stood still, and how long until the "
            "checkpoint was complete on every rank (written in the background with "
            "train.async_save):",
        ),
        ("table", ("step", "training waited", "save took"), rows),
    ]
    if loads:
        blocks.append(("p", "Resumed (checksums verified, then loaded): " + "; ".join(loads)))
    return blocks


def _faults_section(paths: RunPaths) -> list[tuple]:
    """Each fault that ended a training attempt, what it cost and what was done about it."""
    rows = [
        (
            r["time"],
            r["attempt"],
            r["kind"],
            ", ".join(map(str, r["ranks"])),
            ", ".join(r["nodes"]),
            r["step"],
            r["steps_lost"],
            _seconds(r["seconds_lost"]),
            r["action"],
        )
        for r in read_failures(paths)
    ]
    if not rows:
        return []
    header = (
        "time",
        "attempt",
        "kind",
        "ranks",
        "nodes",
        "step",
        "steps lost",
        "time lost",
        "action",
    )
    return [("h3", "Faults"), ("table", header, rows)]


def _stragglers_section(paths: RunPaths) -> list[tuple]:
    rows = [(s["step"], s["rank"], s["node"], f"{s['ratio']:.2f}x") for s in read_stragglers(paths)]
    if not rows:
        return []
    return [
        ("h3", "Stragglers"),
        (
            "p",
            "Ranks whose own work per step exceeded the median rank's for several log intervals:",
        ),
        ("table", ("step", "rank", "node", "own work / median"), rows),
    ]


def _results_section(paths: RunPaths, evaluation: dict) -> list[tuple]:
    if not evaluation and paths.eval_done.exists():
        why = "the evaluation in eval/ is of an earlier training: rerun with stages=[evaluate]"
        return [("h2", "Test results"), ("p", why)]
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
                f"{r['bpb']:.4f}" if "bpb" in r else "-",
                sum(r["rejected"].values()) if "rejected" in r else "-",
            )
            for name, r in sets.items()
        ]
        blocks += [
            ("p", "Every set, by the same checkpoint (test: the held-out split):"),
            (
                "table",
                (
                    "set",
                    "documents",
                    "tokens",
                    "loss",
                    "perplexity",
                    "bits/byte",
                    "rejected records",
                ),
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
        plot = plot_checkpoints(paths, checkpoints)
        blocks += [
            ("h2", "Every checkpoint kept"),
            ("table", ("step", "validation loss", "test loss", "test perplexity"), rows),
            ("img", plot.relative_to(paths.root), "test loss by checkpoint"),
        ]
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


def job_accounting(paths: RunPaths, evaluation: dict) -> list[tuple[str, float | None, str]]:
    """(step, wall seconds, note) for each step of the graph, from its completion marker."""
    tokenizer = files.read_json_or_none(paths.tokenizer_meta) or {}
    manifest = files.read_json_or_none(paths.manifest) or {}
    shards = manifest.get("shards", [])
    index = files.read_json_or_none(paths.index_done) or {}
    train = files.read_json_or_none(paths.train_done) or {}
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


def _jobs_section(paths: RunPaths, evaluation: dict, metrics: Metrics) -> list[tuple]:
    rows = [(step, _seconds(s), note) for step, s, note in job_accounting(paths, evaluation)]
    train = files.read_json_or_none(paths.train_done) or {}
    eval_hours = evaluation.get("gpus", 0) * (evaluation.get("seconds") or 0) / 3600
    train_hours = train.get("gpu_hours", 0.0)
    resumes = metrics.resumes
    jobs = files.read_json_or_none(paths.jobs) or []
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


def report_blocks(paths: RunPaths, evaluation: dict) -> list[tuple]:
    summary = write_summary(paths, evaluation)
    manifest = files.read_json_or_none(paths.manifest) or {}
    metrics = read_metrics(paths)
    config = paths.config.read_text() if paths.config.exists() else ""
    weights = (files.read_json_or_none(paths.train_done) or {}).get("source_weights", {})
    return [
        *_data_section(manifest, weights),
        *plan_blocks(files.read_json_or_none(paths.plan)),
        *_training_section(paths, summary, metrics),
        *router_blocks(paths, metrics),
        *_faults_section(paths),
        *_stragglers_section(paths),
        *_results_section(paths, evaluation),
        *downstream_blocks(paths),
        *_samples_section(evaluation),
        *_jobs_section(paths, evaluation, metrics),
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


def write_report(paths: RunPaths, evaluation: dict | None = None) -> Path:
    """report.md and report.html in the run folder; `evaluation` as in write_summary."""
    if evaluation is None:
        evaluation = current_evaluation(paths)
    blocks = report_blocks(paths, evaluation)
    title = f"Run report: {paths.root.name}"
    files.write_text(paths.report, to_markdown(title, blocks))
    files.write_text(paths.report_html, to_html(title, blocks))
    return paths.report
