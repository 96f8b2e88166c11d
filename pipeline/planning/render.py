"""The plan as printed: a few lines before a launch, or the whole breakdown of
`python -m pipeline.plan` (parameters, FLOPs, memory per GPU, activations by recompute mode,
wall time, and the layout search)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeline.config import ModelConfig, PipelineConfig
from pipeline.config.choices import RECOMPUTE_MODES
from pipeline.config.derived import world_size
from pipeline.core.paths import RunPaths
from pipeline.data import mixture
from pipeline.model.figures import ModelFigures
from pipeline.planning import hardware, run_gpu
from pipeline.planning.hardware import Hardware
from pipeline.planning.memory import (
    memory_per_gpu,
    micro_batches_in_flight,
    stage_activations,
)
from pipeline.planning.parallel_layout import ParallelLayout
from pipeline.planning.run_gpu import RunGpu
from pipeline.planning.run_plan import Plan
from pipeline.planning.search import search_layouts
from pipeline.planning.throughput import steps_for, tokens_per_step
from pipeline.planning.units import GIB, count, duration, gib
from pipeline.planning.units import flops as flops_text
from pipeline.resilience import watchdog


@dataclass
class PlanOptions:
    """Settings of `python -m pipeline.plan` beside the config: search the layouts, over how
    many GPUs, over which token budget, at an MFU of the user's instead of the estimate's, as
    JSON. The GPU is the run's (pipeline.planning.run_gpu): --gpu and --gpu-memory set
    cluster.gpu and cluster.gpu_memory_gb."""

    search: bool = False
    gpus: int | None = None
    tokens: float | None = None
    mfu: float | None = None
    json: bool = False


def summary_lines(cfg: PipelineConfig, plan: Plan) -> list[str]:
    """A few lines for the launcher to print before it submits: parameters, FLOPs, the plan's
    per-GPU memory, tokens per step, its expected speed on the run's GPU."""
    layout, memory = plan.layout, plan.memory
    counts = plan.figures.parameters
    where = "GPU" if layout.fused_kernels else "rank"
    per_token = plan.figures.flops_per_sequence / cfg.model.seq_length
    steps = cfg.train.steps
    parts = ", ".join(
        f"{key} {memory[key] / GIB:.1f}"
        for key in ("weights", "gradients", "optimizer", "activations", "logits", "overhead")
    )
    lines = [
        f"[plan] {cfg.model.name}: {count(counts['total'])} parameters (embedding "
        f"{count(counts['embedding'])}, output layer {count(counts['output_layer'])}), "
        f"{per_token / 1e9:.2f} GFLOP/token",
        f"[plan] memory per {where} ~{gib(memory['total'])} ({parts} GiB) for {layout.describe()}",
        *([f"[plan] chosen: {plan.reasons}"] if plan.reasons else []),
        *_overlap_lines(cfg, layout),
        f"[plan] {tokens_per_step(cfg):,} tokens/step x {steps} steps = "
        f"{count(tokens_per_step(cfg) * steps)} tokens",
        *_speed_lines(plan),
        *mixture.plan_lines(cfg, plan.data.train_tokens),
    ]
    hang = watchdog.plan_line(cfg.resilience.hang_timeout_s, RunPaths.of(cfg.workdir))
    return lines + ([hang] if hang else [])


def _overlap_lines(cfg: PipelineConfig, layout: ParallelLayout) -> list[str]:
    """The communication settings a run of several GPUs trains with (none on one GPU)."""
    if layout.gpus == 1 or not layout.fused_kernels:
        return []
    p = cfg.parallel
    on = {
        "overlap_grad_reduce": p.overlap_grad_reduce and layout.data > 1,
        "overlap_param_gather": p.overlap_param_gather
        and p.distributed_optimizer
        and layout.data > 1,
        "sequence_parallel": layout.sequence_parallel,
        "tp_comm_overlap": layout.tp_comm_overlap,
    }
    bucket = f"{p.ddp_bucket_size:,} parameters" if p.ddp_bucket_size else "megatron-core's size"
    settings = ", ".join(f"{key}={'on' if value else 'off'}" for key, value in on.items())
    return [f"[plan] communication: {settings}; gradient buckets of {bucket}"]


def _speed_lines(plan: Plan) -> list[str]:
    """The layout's expected speed on the run's GPU."""
    gpu, hw, est = plan.gpu, plan.hardware, plan.step
    if not plan.layout.fused_kernels or gpu is None:
        return []
    assumed = f" ({gpu.source})" if gpu.assumed else ""
    return [
        f"[plan] expected on {hw.name}{assumed}: {est['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, "
        f"MFU {est['mfu']:.2f}, {est['step_s']:.2f} s/step ({breakdown_text(est)})"
    ]


def _parameter_lines(cfg: PipelineConfig, plan: Plan) -> list[str]:
    m, figures, data = cfg.model, plan.figures, plan.data
    c = figures.parameters
    groups = m.num_query_groups or m.num_attention_heads
    position = f" + {count(c['position_embedding'])} positions" if c["position_embedding"] else ""
    tied = "untied" if m.untie_embeddings else "tied to the embedding"
    lines = [
        f"Model {m.name}: {m.num_layers} layers, hidden {m.hidden_size}, "
        f"{m.num_attention_heads} heads ({groups} query groups), FFN {figures.ffn_hidden_size} "
        f"{m.activation}, {m.normalization}, {m.position_embedding}; sequence {m.seq_length}",
        f"Vocabulary: {data.vocab_size} ({data.vocab_source}), padded to {c['padded_vocab']}",
        f"Parameters: {count(c['total'])} ({c['total']:,})",
        f"  embedding     {count(c['embedding']):>9}  ({c['padded_vocab']} x {m.hidden_size}"
        f"{position})",
        f"  transformer   {count(c['transformer']):>9}  ({_layers_text(m, c)}; final norm "
        f"{count(c['final_norm'])})",
        f"  output layer  {count(c['output_layer']):>9}  ({tied})",
    ]
    if c["moe_layers"]:  # FLOPs, MFU and the time model count these
        lines.insert(
            3, f"Active parameters: {count(c['active'])} ({c['active']:,}; top {m.moe.top_k})"
        )
    t, p = plan.layout.tensor, plan.layout.pipeline
    per_gpu = ", ".join(
        f"stage {s}: {count(figures.stages[s]['total'])}" for s in sorted({0, p - 1})
    )
    lines.append(f"  per GPU (TP={t}, PP={p}): {per_gpu}")
    return lines


def _layers_text(m: ModelConfig, c: dict[str, int]) -> str:
    dense = (
        f"{c['dense_layers']} x {count(c['layer'])}: attention {count(c['attention_per_layer'])}, "
        f"MLP {count(c['mlp_per_layer'])}, norms {count(c['norms_per_layer'])}"
    )
    if not c["moe_layers"]:
        return dense
    moe = (
        f"{c['moe_layers']} MoE x {count(c['moe_layer'])}: {m.moe.experts} experts "
        f"{count(c['experts_per_layer'])}"
    )
    return moe + (f"; {dense}" if c["dense_layers"] else "")


def _memory_lines(cfg: PipelineConfig, plan: Plan) -> list[str]:
    layout, memory, gpu = plan.layout, plan.memory, plan.gpu
    # the one figure beside the plan's: the other distributed-optimizer setting
    flipped = replace(layout, distributed_optimizer=not layout.distributed_optimizer)
    other = memory_per_gpu(cfg.model, plan.figures, flipped)
    with_opt = memory if layout.distributed_optimizer else other
    without = other if layout.distributed_optimizer else memory
    in_flight = micro_batches_in_flight(layout, memory["stage"])
    master = "fp32 Adam moments" if layout.precision == "fp32" else "fp32 master + Adam moments"
    grads = "fp32 (megatron DDP main grads)"
    weights = "fp32" if layout.precision == "fp32" else "bf16"
    if layout.precision == "fp8":
        weights += " + fp8 weight copies"
    where = "GPU" if layout.fused_kernels else "rank"
    rows = [
        ("weights", memory["weights"], weights),
        ("gradients", memory["gradients"], grads),
        (
            "optimizer",
            memory["optimizer"],
            f"{master}; distributed over DP={layout.data}: {gib(with_opt['optimizer'])}, "
            f"not distributed: {gib(without['optimizer'])}",
        ),
        (
            "activations",
            memory["activations"],
            f"{in_flight:g} micro-batch{'' if in_flight == 1 else 'es'} in flight x "
            f"{gib(memory['activations_per_micro_batch'])}",
        ),
        ("logits", memory["logits"], "final norm and logits, last stage"),
        ("recompute", memory["working"], "one layer recomputed in backward"),
        ("overhead", memory["overhead"], "CUDA context, workspaces, allocator slack"),
    ]
    lines = [f"Memory per {where} (pipeline stage {memory['stage']}, the largest):"]
    lines += [f"  {name:<12} {gib(value):>10}  {note}" for name, value, note in rows]
    against = ""
    if gpu is not None and gpu.capacity is not None:
        fits = "fits" if plan.fits else "DOES NOT FIT"
        against = f"of {gib(gpu.capacity)} of {_gpu_text(gpu)}: {fits} "
    lines.append(
        f"  {'total':<12} {gib(memory['total']):>10}  {against}(with distributed optimizer "
        f"{gib(with_opt['total'])}, without {gib(without['total'])})"
    )
    return lines


def _activation_table(
    cfg: PipelineConfig, figures: ModelFigures, layout: ParallelLayout
) -> list[str]:
    columns = [("bf16", False), ("fp8", False)]
    if layout.tensor > 1:
        columns += [("bf16", True), ("fp8", True)]
    if not layout.fused_kernels:
        columns = [(layout.precision, False)]
    split, pipeline = layout.pipeline_split, layout.pipeline
    layers = split.most_layers(cfg.model.num_layers, pipeline)
    fullest = next(
        s for s in range(pipeline) if split.layers(cfg.model.num_layers, pipeline, s) == layers
    )
    local = replace(cfg.model, seq_length=cfg.model.seq_length // layout.context)
    head = "".join(f"{precision + (' +SP' if sp else ''):>12}" for precision, sp in columns)
    lines = [
        f"Activations per micro-batch ({layers} layers on a GPU, micro-batch "
        f"{layout.micro_batch}, TP={layout.tensor}):",
        f"  {'recompute':<10}{head}",
    ]
    for mode in RECOMPUTE_MODES:
        variants = (
            replace(layout, precision=precision, sequence_parallel=sp, recompute=mode)
            for precision, sp in columns
        )
        cells = "".join(
            f"{gib(stage_activations(local, figures, v, stage=fullest)):>12}" for v in variants
        )
        lines.append(f"  {mode:<10}{cells}")
    return lines


def token_budget(cfg: PipelineConfig, options: PlanOptions) -> tuple[float, str]:
    if options.tokens:
        return options.tokens, "--tokens"
    return tokens_per_step(cfg) * cfg.train.steps, f"train.steps={cfg.train.steps}"


def _gpu_text(gpu: RunGpu) -> str:
    return f"{gpu.name} ({gpu.source})"


def _time_lines(cfg: PipelineConfig, plan: Plan, options: PlanOptions) -> list[str]:
    layout, gpu = plan.layout, plan.gpu
    per_step = tokens_per_step(cfg)
    budget, source = token_budget(cfg, options)
    steps = steps_for(budget, cfg)
    lines = [
        f"Tokens per step: {cfg.train.global_batch_size} x {cfg.model.seq_length} = {per_step:,}",
        f"Token budget: {count(budget)} ({source}) = {steps:,} steps",
    ]
    if gpu is None:
        lines.append("Wall time: no GPU in this config; name one with --gpu H100 for an estimate")
        return lines
    hw, est = plan.hardware, plan.step
    step_s, how = est["step_s"], f"estimated for this layout, MFU {est['mfu']:.2f}"
    if options.mfu:  # the user's MFU instead of the estimate's
        step_s *= est["mfu"] / options.mfu
        how = f"at the given MFU {options.mfu:.2f}"
    peak = hw.peak_tflops(layout.precision)
    assumed = f" ({gpu.source})" if gpu.assumed else ""
    lines += [
        f"Wall time: {duration(step_s * steps)} on {layout.gpus} x {hw.name}{assumed} "
        f"({peak:g} TFLOP/s) "
        f"({how}); {step_s:.2f} s/step, {est['tokens_per_s_per_gpu'] * est['step_s'] / step_s:,.0f}"
        " tokens/s per GPU",
        "  step: " + breakdown_text(est),
    ]
    return lines


def breakdown_text(est: dict[str, float]) -> str:
    parts = (
        ("compute", "compute_s"),
        ("exposed TP", "tp_comm_s"),
        ("all-to-all", "ep_comm_s"),
        ("pipeline bubble", "bubble_s"),
        ("exposed DP", "dp_comm_s"),
        ("optimizer", "optimizer_s"),
    )
    return ", ".join(f"{name} {est[key]:.3f} s" for name, key in parts)


def _search_lines(
    cfg: PipelineConfig, vocab_size: int, gpus: int, per_node: int, gpu: RunGpu, hw: Hardware
) -> list[str]:
    capacity = gpu.capacity or 0
    found = search_layouts(cfg, vocab_size, gpus, 0, per_node, hw, capacity=capacity)
    lines = [
        "",
        f"Layout search: {cfg.model.name} on {gpus} x {_gpu_text(gpu)} ({gib(capacity)}), "
        f"{per_node} per node, sequence {cfg.model.seq_length}, global batch "
        f"{cfg.train.global_batch_size}; ranked by expected tokens/s on {hw.name} "
        f"(NVLink domain {hw.nvlink_domain})",
        f"  {'#':>3} {'TP':>3} {'PP':>3} {'vp':>3} {'DP':>4} {'EP':>3} {'mbs':>4} {'accum':>5} "
        f"{'recompute':<10}"
        f"{'SP':<4}{'memory':>11} {'MFU':>6} {'tok/s/GPU':>10} {'step':>9}",
    ]
    for i, c in enumerate(found.feasible[:15], 1):
        lo, th = c.layout, c.throughput
        lines.append(
            f"  {i:>3} {lo.tensor:>3} {lo.pipeline:>3} {lo.virtual_pipeline or '-':>3} "
            f"{lo.data:>4} {lo.expert:>3} {lo.micro_batch:>4} "
            f"{lo.grad_accum:>5} {lo.recompute:<10}{'yes' if lo.sequence_parallel else '-':<4}"
            f"{gib(c.memory['total']):>11} {th['mfu']:>6.2f} "
            f"{th['tokens_per_s_per_gpu']:>10,.0f} {th['step_s']:>8.2f}s"
        )
    if len(found.feasible) > 15:
        lines.append(f"  ... and {len(found.feasible) - 15} more that fit")
    if not found.feasible:
        lines.append("  no layout fits")
    if found.rejected:
        lines.append(f"Rejected ({len(found.rejected)}):")
        lines += [f"  {reason}" for reason in found.rejected[:20]]
        if len(found.rejected) > 20:
            lines.append(f"  ... and {len(found.rejected) - 20} more")
    return lines


def plan_lines(cfg: PipelineConfig, plan: Plan, options: PlanOptions) -> list[str]:
    """The whole plan for a validated config, as lines to print; every figure for the run's
    GPU (a CPU run's only when one is named)."""
    vocab_size, layout, gpu = plan.data.vocab_size, plan.layout, plan.gpu
    flops = plan.figures.flops_per_sequence
    lines = _parameter_lines(cfg, plan)
    lines.append(
        f"FLOPs per token: {flops_text(flops / cfg.model.seq_length)} ({flops_text(flops)} per "
        "sequence; Megatron-LM's formula)"
    )
    gpus = f"{layout.gpus} GPU{'' if layout.gpus == 1 else 's'}"
    lines.append(f"Layout: {gpus}, {layout.describe()}")
    if plan.reasons:
        lines.append(f"  chosen: {plan.reasons}")
    lines += _memory_lines(cfg, plan)
    lines += _activation_table(cfg, plan.figures, layout)
    lines += _time_lines(cfg, plan, options)
    lines += [
        line.removeprefix("[plan] ") for line in mixture.plan_lines(cfg, plan.data.train_tokens)
    ]
    if options.search:
        gpus = options.gpus or world_size(cfg.cluster)
        per_node = max(1, min(cfg.cluster.gpus_per_node or 8, gpus))
        searched = gpu if gpu is not None and gpu.capacity else run_gpu.ASSUMED
        # the plan's GPU and fabric, or H100 assumed where the plan's GPU has no known memory
        same = searched is (plan.gpu or run_gpu.ASSUMED)
        hw = plan.hardware if same else hardware.of(cfg, run_gpu.ASSUMED.name)
        lines += _search_lines(cfg, vocab_size, gpus, per_node, searched, hw)
    return lines


def plan_json(cfg: PipelineConfig, plan: Plan, options: PlanOptions) -> dict:
    """The configured (or chosen) layout and its estimate, for other tools to read."""
    layout, hw, est = plan.layout, plan.hardware, plan.step
    gpu = plan.gpu or run_gpu.ASSUMED
    steps = steps_for(token_budget(cfg, options)[0], cfg)
    return {
        "model": cfg.model.name,
        "gpu": hw.name,
        "gpu_source": gpu.source,
        "gpu_memory_gib": gpu.capacity / GIB if gpu.capacity else None,
        "gpus": layout.gpus,
        "tokens_per_s_per_gpu": est["tokens_per_s_per_gpu"],
        "tflops_per_gpu": est["tflops_per_gpu"],
        "mfu": est["mfu"],
        "step_seconds": est["step_s"],
        "steps": steps,
        "wall_seconds": est["step_s"] * steps,
        "memory_gib_per_gpu": plan.memory["total"] / GIB,
        "layout": {
            "tp": layout.tensor,
            "pp": layout.pipeline,
            "vp": layout.virtual_pipeline,
            "dp": layout.data,
            "micro_batch": layout.micro_batch,
            "grad_accum": layout.grad_accum,
            "recompute": layout.recompute,
            "sequence_parallel": layout.sequence_parallel,
            "overlap_grad_reduce": layout.overlap_grad_reduce,
            "overlap_param_gather": layout.overlap_param_gather,
            "tp_comm_overlap": layout.tp_comm_overlap,
        },
        "breakdown": {
            "compute": est["compute_s"],
            "exposed_tp": est["tp_comm_s"],
            "all_to_all": est["ep_comm_s"],
            "pp_bubble": est["bubble_s"],
            "exposed_dp": est["dp_comm_s"],
            "optimizer": est["optimizer_s"],
        },
        "auto_choice": plan.reasons,
    }
