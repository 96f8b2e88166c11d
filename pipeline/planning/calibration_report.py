"""`python -m pipeline.plan --validate` (the calibration report): every published row predicted at its layout, the
error, the bounds, and the planner's own choice for the row's model, GPUs and global batch
beside the published layout (or why it is slower: what the search leaves out, or memory)."""

from __future__ import annotations

from pipeline.planning import calibration as v
from pipeline.planning.parallel_layout import ParallelLayout
from pipeline.planning.scaling import MICRO_BATCHES, best_layout
from pipeline.planning.search import pipeline_problem
from pipeline.planning.throughput import expected_step


def planner_choice(row: v.Row) -> tuple[ParallelLayout, float] | None:
    """The fastest layout the planner's search finds for the row's model, GPU count, GPU and
    global batch (precision and overlap settings as published; no context parallelism)."""
    pub = row.layout
    capacity = v.capacity(row.hardware)
    choice = best_layout(
        row.model, row.vocab, pub.gpus, pub.global_batch, row.hardware, capacity, pub
    )
    return (choice.layout, choice.tokens_per_s) if choice else None


def why_slower(row: v.Row, published_layout: ParallelLayout) -> str:
    reasons = []
    lo = published_layout
    if lo.context > 1:
        reasons.append(f"published uses context parallelism (CP={lo.context}), not searched")
    if pipeline_problem(row.model, lo.pipeline):
        reasons.append(f"published PP={lo.pipeline} splits the layers unevenly")
    if lo.micro_batch not in MICRO_BATCHES:
        reasons.append(f"micro-batch {lo.micro_batch} is beyond the search")
    if not v.fits(row, lo):
        need = v.memory_need(row, lo) / 2**30
        reasons.append(f"published layout needs ~{need:.0f} GiB by the memory estimate")
    return "; ".join(reasons) or "not explained"


def _layout_text(lo: ParallelLayout) -> str:
    vp = f"x{lo.virtual_pipeline}" if lo.virtual_pipeline else ""
    cp = f" CP{lo.context}" if lo.context > 1 else ""
    return f"TP{lo.tensor} PP{lo.pipeline}{vp}{cp} DP{lo.data} mb{lo.micro_batch} {lo.recompute}"


def report_lines(choices: bool = True) -> tuple[list[str], bool]:
    """The report, and whether the bounds hold on the complete rows: fitted, held out, and held
    out from sources no fitted row comes from."""
    rows = v.load()
    lines = ["Throughput model constants (pipeline/planning/throughput.py):"]
    lines += v.constants_lines()
    lines += [
        "",
        f"{'row':<36} {'GPUs':>5} {'layout':<28} {'published':>10} {'predicted':>10} {'error':>7}",
    ]
    for row in rows:
        layout = v.completed(row)
        figures = layout.model_figures(row.model, row.vocab)
        predicted = expected_step(row.model, figures, layout, row.hardware)
        error = predicted["tokens_per_s_per_gpu"] / row.published - 1
        mark = ("" if row.role == "fit" else " h") + ("" if row.complete else " *")
        lines.append(
            f"{row.id:<36} {row.hardware.name + ' x' + str(layout.gpus):>12} "
            f"{_layout_text(layout):<28} {row.published:>10,.0f} "
            f"{predicted['tokens_per_s_per_gpu']:>10,.0f} {error:>+7.1%}{mark}"
        )
        if choices:
            lines.append("    " + _choice_text(row, layout, predicted["tokens_per_s_per_gpu"]))
    lines += [
        "h held out: never used to fit the constants",
        "* the source leaves part of the layout out: predicted at the fastest completion that "
        "fits, not counted in the bounds",
    ]
    ok = True
    for name, counted in v.moe_sets(rows).items():
        summary = v.bounds(v.errors(counted))
        lines.append(
            f"{v.SET_NAMES[name]}: {summary['rows']:.0f}; within {v.WITHIN:.0%}: "
            f"{summary['within']:.0%}; median absolute error {summary['median']:.1%}"
        )
    for name, counted in v.counted_sets(rows).items():
        summary = v.bounds(v.errors(counted))
        holds = v.holds(summary)
        ok = ok and holds
        lines.append(
            f"{v.SET_NAMES[name]}: {summary['rows']:.0f}; within {v.WITHIN:.0%}: "
            f"{summary['within']:.0%} (bound {v.SHARE_WITHIN:.0%}); median absolute error "
            f"{summary['median']:.1%} (bound {v.MEDIAN_BOUND:.0%}): {'holds' if holds else 'FAILS'}"
        )
    return lines, ok


def _choice_text(row: v.Row, layout: ParallelLayout, published_estimate: float) -> str:
    choice = planner_choice(row)
    if choice is None:
        return f"planner: no layout fits ({why_slower(row, layout)})"
    chosen, tokens = choice
    gain = tokens / published_estimate - 1
    text = f"planner: {_layout_text(chosen)} at {tokens:,.0f} ({gain:+.1%} vs the published layout)"
    if gain < -0.005:
        text += f"; slower because {why_slower(row, layout)}"
    return text
