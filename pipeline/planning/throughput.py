"""Expected speed of a parallel layout: step time, throughput and wall time at a model-FLOPs
utilisation, with FLOPs by Megatron-LM's formula (pipeline.model.flops)."""

from __future__ import annotations

import math
import statistics

from pipeline.config import PipelineConfig
from pipeline.core.paths import RunPaths
from pipeline.model.flops import flops_per_sequence
from pipeline.model.parameters import stage_params
from pipeline.planning.memory import activation_dtype_bytes
from pipeline.planning.parallel_layout import ParallelLayout
from pipeline.reporting.summary import read_metrics

DEFAULT_MFU = 0.5
# Throughput heuristic. Extra compute of recomputation: full recompute repeats each layer's
# forward (3 passes -> 4); selective recomputes only core attention.
RECOMPUTE_COST = {"none": 1.0, "selective": 1.03, "full": 4.0 / 3.0}
# GEMM efficiency falls for short micro-batches: tokens / (tokens + GEMM_HALF_TOKENS).
GEMM_HALF_TOKENS = 512
# NCCL bus bandwidth per GPU, GB/s: NVLink inside a node (H100/H200), InfiniBand across nodes.
NVLINK_GBPS = 350.0
NETWORK_GBPS = 40.0
# Share of the data-parallel gradient reduction not hidden behind backward compute.
DP_EXPOSED = {True: 0.2, False: 1.0}  # by parallel.overlap_grad_reduce


def tokens_per_step(cfg: PipelineConfig) -> int:
    return cfg.train.global_batch_size * cfg.model.seq_length


def steps_for(tokens: float, cfg: PipelineConfig) -> int:
    return math.ceil(tokens / tokens_per_step(cfg))


def wall_seconds(
    cfg: PipelineConfig, vocab_size: int, steps: int, gpus: int, peak: float, mfu: float
) -> float:
    """Seconds for `steps` at a model-FLOPs utilisation `mfu` of `peak` TFLOP/s per GPU."""
    per_sequence = flops_per_sequence(cfg.model, vocab_size, cfg.parallel.tensor)
    flops = per_sequence * cfg.train.global_batch_size * steps
    return flops / (gpus * peak * 1e12 * mfu)


def _allreduce_seconds(nbytes: float, ranks: int, gbps: float) -> float:
    return 2 * (ranks - 1) / ranks * nbytes / (gbps * 1e9) if ranks > 1 else 0.0


def expected_step(
    cfg: PipelineConfig,
    vocab_size: int,
    layout: ParallelLayout,
    gpus_per_node: int = 8,
    peak: float = 989.0,
    mfu: float = DEFAULT_MFU,
) -> dict[str, float]:
    """Expected step time and throughput of a layout (the ranking heuristic).

    A micro-batch's compute on one GPU is its share 1/(TP x PP) of the model FLOPs, at `mfu` of
    `peak` scaled by the GEMM efficiency of its micro-batch and slowed by recompute; tensor
    parallelism adds 4 exposed all-reduces of the hidden state per layer (6 with full recompute)
    over NVLink inside a node, the network beyond; the pipeline bubble stretches the
    micro-batches by (PP-1)/v over m; the data-parallel gradient reduction is exposed
    unless overlapped. Point-to-point pipeline traffic is small and left out."""
    m = cfg.model
    t, p, dp = layout.tensor, layout.pipeline, layout.data
    s, b = m.seq_length, layout.micro_batch
    peak_flops = peak * 1e12
    tokens = s * b
    gemm = tokens / (tokens + GEMM_HALF_TOKENS)
    per_sequence = flops_per_sequence(m, vocab_size, cfg.parallel.tensor)
    model_flops_mb = per_sequence * b / (t * p)
    compute = model_flops_mb * RECOMPUTE_COST[layout.recompute] / (peak_flops * mfu * gemm)
    tp_gbps = NVLINK_GBPS if t <= gpus_per_node else NETWORK_GBPS
    collectives = 6 if layout.recompute == "full" else 4
    hidden_bytes = activation_dtype_bytes(layout) * tokens * m.hidden_size
    tp_comm = (m.num_layers // p) * collectives * _allreduce_seconds(hidden_bytes, t, tp_gbps)
    bubble = (p - 1) / (layout.virtual_pipeline or 1)
    pipeline_s = (compute + tp_comm) * (layout.grad_accum + bubble)
    params = max(stage_params(m, vocab_size, t, p, stage)["total"] for stage in {0, p - 1})
    # as all-reduce volume: fp32 gradients reduce-scattered and bf16 weights all-gathered by the
    # distributed optimizer (together half of 4 + 2 bytes), or fp32 gradients all-reduced
    grad_bytes = (4 + 2) / 2 * params if layout.distributed_optimizer else 4 * params
    dp_gbps = NVLINK_GBPS if t * dp <= gpus_per_node else NETWORK_GBPS
    dp_comm = _allreduce_seconds(grad_bytes, dp, dp_gbps) * DP_EXPOSED[layout.overlap_grad_reduce]
    step = pipeline_s + dp_comm
    gpus = layout.gpus
    step_flops = per_sequence * layout.global_batch
    return {
        "step_s": step,
        "compute_s": compute * layout.grad_accum,
        "tp_comm_s": tp_comm * layout.grad_accum,
        "bubble_s": (compute + tp_comm) * bubble,
        "dp_comm_s": dp_comm,
        "mfu": step_flops / gpus / (step * peak_flops),
        "tokens_per_s_per_gpu": layout.global_batch * s / step / gpus,
    }


def measured_mfu(cfg: PipelineConfig) -> float | None:
    """The median MFU the run's training logged, if it has trained on GPUs."""
    logged = [r["mfu"] for r in read_metrics(RunPaths.of(cfg.workdir)).train if "mfu" in r]
    return statistics.median(logged) if logged else None
