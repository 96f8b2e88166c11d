"""The report's router health of a mixture of experts (train/metrics.jsonl's moe_* entries):
each MoE layer's load at the last log interval, the collapses training warned of, and a plot
of expert load over steps."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.paths import RunPaths
from pipeline.reporting.plots import pyplot, save_figure
from pipeline.reporting.summary import Metrics


def router_blocks(paths: RunPaths, metrics: Metrics) -> list[tuple]:
    logged = [r for r in metrics.train if "moe_layers" in r]
    if not logged:
        return []
    last = logged[-1]
    rows = [
        (
            layer,
            f"{v['max_over_mean']:.2f}",
            v["idle_experts"],
            f"{100 * v['dropped']:.1f}%",
            last.get("moe_collapse", {}).get(layer, "-"),
        )
        for layer, v in sorted(last["moe_layers"].items(), key=lambda kv: int(kv[0]))
    ]
    losses = ", ".join(
        f"{key.removeprefix('moe/')} {last[key]:.4f}"
        for key in ("moe/aux_loss", "moe/seq_aux_loss", "moe/z_loss")
        if key in last
    )
    blocks = [
        ("h3", "Router health"),
        (
            "p",
            f"Each MoE layer over the last log interval (step {last['step']}): the busiest "
            "expert's tokens over the mean (1.00: even), experts that received no token, and "
            "token-to-expert assignments dropped for capacity"
            + (f"; auxiliary losses (before their weights): {losses}" if losses else "")
            + ". Tokens/s, TFLOP/s and MFU count active parameters only (top_k of each layer's "
            "experts).",
        ),
        ("table", ("layer", "max / mean", "idle experts", "dropped", "collapse"), rows),
    ]
    collapses = [
        (r["step"], layer, problem)
        for r in logged
        for layer, problem in sorted(r.get("moe_collapse", {}).items())
    ]
    if collapses:
        blocks += [
            ("p", "Routing collapses training warned of:"),
            ("table", ("step", "layer", "what"), collapses),
        ]
    plot = plot_expert_load(paths, logged)
    if plot:
        blocks.append(("img", plot.relative_to(paths.root), "expert load over steps"))
    return blocks


def plot_expert_load(paths: RunPaths, logged: list[dict]) -> Path | None:
    """train/expert_load.png: each MoE layer's max-over-mean load against steps, and each
    expert's share of the most uneven layer's tokens over steps."""
    layers = sorted(logged[-1]["moe_layers"], key=int)
    worst = max(layers, key=lambda layer: logged[-1]["moe_layers"][layer]["max_over_mean"])
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(11, 4), dpi=120)
    for layer in layers:
        held = [r for r in logged if layer in r["moe_layers"]]
        left.plot(
            [r["step"] for r in held],
            [r["moe_layers"][layer]["max_over_mean"] for r in held],
            label=f"layer {layer}",
        )
    left.axhline(1.0, color="grey", linewidth=0.8)
    left.set_xlabel("step")
    left.set_ylabel("busiest expert / mean")
    left.grid(alpha=0.3)
    if len(layers) <= 12:
        left.legend(fontsize="small")
    held = [r for r in logged if worst in r["moe_layers"]]
    shares = [r["moe_layers"][worst]["share"] for r in held]
    by_expert = [list(column) for column in zip(*shares, strict=True)]
    image = right.imshow(by_expert, aspect="auto", origin="lower", interpolation="nearest")
    every = max(1, len(held) // 8)  # at most 8 step labels
    right.set_xticks(range(0, len(held), every), [r["step"] for r in held][::every])
    right.set_xlabel("step")
    right.set_ylabel("expert")
    right.set_title(f"layer {worst}: share of tokens", fontsize="medium")
    fig.colorbar(image, ax=right)
    return save_figure(fig, paths.train_dir / "expert_load.png")
