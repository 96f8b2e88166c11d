"""Expected step time of a parallel layout on a machine (pipeline.planning.hardware), from the
work each GPU does and the bytes it moves, with a handful of constants (CONSTANTS) fitted to
published runs (pipeline.planning.calibration; `python -m pipeline.plan --validate`).

One micro-batch on the busiest GPU (the last pipeline stage: its layers and the output layer):
  GEMMs      the shapes each tensor-parallel shard multiplies, at a fraction of the dense peak
             that falls for small dimensions (d / (d + gemm_half_dim) for each of M, N, K);
             forward, data and weight gradient; fp8 GEMMs at their own fraction of the fp8 peak
  attention  causal flash attention (half the s x s scores), backward at 2.5 times forward
  elementwise norms, residual adds, RoPE, the activation and the loss, by the bytes they move
             through HBM (norms and residual adds split across TP ranks only with sequence
             parallelism)
  TP         the all-gathers and reduce-scatters (all-reduces without sequence parallelism) of
             each layer, over NVLink inside the NVLink domain, the network beyond; partly hidden
             with tp_comm_overlap
  recompute  full: the layer's forward once more (and its TP collectives); selective: core
             attention's forward
The step: (micro-batches + (PP-1)/v) micro-batch times (1F1B and the interleaved schedule's
bubble), p2p sends between stages (hidden by the interleaved schedule's overlap), the
data-parallel reduce-scatter / all-gather of the distributed optimizer (or all-reduce), hidden
behind backward / forward when overlapped except the last bucket, and the optimizer's pass
over its state at HBM speed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.config import ModelConfig, PipelineConfig
from pipeline.model.figures import ModelFigures
from pipeline.planning.hardware import Hardware, preset
from pipeline.planning.parallel_layout import ParallelLayout


@dataclass(frozen=True)
class Constants:
    """The fitted constants (see pipeline.planning.calibration for the fit)."""

    gemm_fraction: float = 0.74  # of the bf16 peak a large GEMM reaches (cuBLAS: 0.7-0.85)
    fp8_gemm_fraction: float = 0.56  # of the fp8 peak, with Transformer Engine's casts
    gemm_half_dim: float = 64.0  # a GEMM dimension this small halves the efficiency
    attention_fraction: float = 0.50  # of the bf16 peak flash attention reaches (large heads)
    layer_overhead_ms: float = 0.4  # per layer and micro-batch: gaps between its ~100 kernels
    tp_overlap_hidden: float = 0.6  # share of TP traffic TE's userbuffers overlap hides


CONSTANTS = Constants()
# Physical, not fitted: the share of link bandwidth NCCL's ring collectives reach (nccl-tests
# bus bandwidth on NVLink and InfiniBand), and of HBM bandwidth streaming kernels reach.
NCCL_EFFICIENCY = 0.80
HBM_EFFICIENCY = 0.80
NETWORK_LATENCY_US = 20.0  # a collective's fixed cost across nodes
OPTIMIZER_BYTES = 30  # per parameter and step: fp32 grad, master weight, 2 moments, bf16 weight
BUCKET_PARAMS = 40_000_000  # megatron-core's gradient bucket: max(this, 1M x DP) parameters


def tokens_per_step(cfg: PipelineConfig) -> int:
    return cfg.train.global_batch_size * cfg.model.seq_length


def steps_for(tokens: float, cfg: PipelineConfig) -> int:
    return math.ceil(tokens / tokens_per_step(cfg))


def _gemm_s(m: float, n: float, k: float, peak: float, fraction: float, c: Constants) -> float:
    """Seconds of the three GEMMs (forward, data and weight gradient) of an M x K by K x N."""
    shape = 1.0
    for d in (m, n, k):
        shape *= d / (d + c.gemm_half_dim)
    return 3 * 2 * m * n * k / (peak * 1e12 * fraction * shape)


def _bus_gbps(members: int, stride: int, hw: Hardware) -> float:
    """Ring bandwidth per GPU of a group of `members` ranks `stride` apart: NVLink when it fits
    the NVLink domain, else the NICs of its members in one domain, at most NVLink's."""
    if members * stride <= hw.nvlink_domain:
        return hw.nvlink_gbps * NCCL_EFFICIENCY
    in_domain = max(1, min(members, hw.nvlink_domain // stride))
    return min(hw.nvlink_gbps, in_domain * hw.network_gbps) * NCCL_EFFICIENCY


def _collective_s(nbytes: float, members: int, stride: int, hw: Hardware, calls: int = 1) -> float:
    """A reduce-scatter or all-gather of `nbytes` (the whole buffer) over the group, in `calls`
    collectives (buckets): each pays a latency, across domains growing with log2 of the group
    (NCCL's tree and PAT algorithms at scale)."""
    if members <= 1:
        return 0.0
    across = members * stride > hw.nvlink_domain
    latency = NETWORK_LATENCY_US * math.log2(members) if across else hw.latency_us
    bandwidth = (members - 1) / members * nbytes / (_bus_gbps(members, stride, hw) * 1e9)
    return bandwidth + calls * latency * 1e-6


def _layer_s(
    m: ModelConfig, ffn: int, lo: ParallelLayout, hw: Hardware, c: Constants
) -> tuple[float, float, float, float]:
    """One layer of MLP width `ffn`, one micro-batch, one GPU: (forward + backward compute, its
    elementwise part, forward attention, one forward TP collective) in seconds."""
    t, tokens = lo.tensor, lo.micro_batch * m.seq_length / lo.context
    h, heads = m.hidden_size, m.num_attention_heads
    groups, head_dim = m.num_query_groups or heads, h // heads
    gated = m.activation == "swiglu"
    fp8 = lo.precision == "fp8" and hw.fp8
    peak = hw.peak_tflops("fp8" if fp8 else "bf16")
    fraction = c.fp8_gemm_fraction if fp8 else c.gemm_fraction
    gemms = (
        _gemm_s(tokens, head_dim * (heads + 2 * groups) / t, h, peak, fraction, c)  # QKV
        + _gemm_s(tokens, h, heads * head_dim / t, peak, fraction, c)  # output projection
        + _gemm_s(tokens, ffn * (2 if gated else 1) / t, h, peak, fraction, c)  # FC1
        + _gemm_s(tokens, h, ffn / t, peak, fraction, c)  # FC2
    )
    e = 4 if lo.precision == "fp32" else 2
    attention_fwd = _attention_fwd_s(m, lo, hw, c, tokens, e)
    whole = 10 * h * e  # two norms (read, write) and two residual adds (two reads, a write)
    if m.hidden_dropout > 0:  # two dropouts: read, write and a mask byte each
        whole += 2 * (2 * e + 1) * h
    split = (2 * (heads + groups) * head_dim + (3 if gated else 2) * ffn) * e  # RoPE, activation
    if fp8:  # casts of the four GEMM inputs and the gradients to fp8
        split += 3 * (h + ffn) * e
    seq_split = t if lo.sequence_parallel else 1
    per_token = 3 * (whole / seq_split + split / t)  # backward moves about twice forward's bytes
    elementwise = per_token * tokens / (hw.hbm_gbps * 1e9 * HBM_EFFICIENCY)
    compute = gemms + 3.5 * attention_fwd + elementwise + c.layer_overhead_ms * 1e-3
    tp_one = _collective_s(tokens * h * e, t, 1, hw) if t > 1 else 0.0
    return compute, elementwise, attention_fwd, tp_one


def _attention_fwd_s(
    m: ModelConfig, lo: ParallelLayout, hw: Hardware, c: Constants, tokens: float, e: int
) -> float:
    """Core attention's forward on one GPU (backward: 2.5 times it). Flash attention computes
    the causal half of Q K^T and P V at a fraction of the bf16 peak that falls with the head
    dimension (the matmuls' inner size); unfused attention multiplies the whole s x s matrix
    and writes the scores, the softmax (and its dropout) through HBM."""
    heads, head_dim = m.num_attention_heads / lo.tensor, m.hidden_size // m.num_attention_heads
    s = m.seq_length
    shape = head_dim / (head_dim + c.gemm_half_dim)
    if lo.fused_kernels and lo.precision != "fp32":
        flops = 2 * 2 * tokens * s / 2 * heads * head_dim
        return flops / (hw.bf16_tflops * 1e12 * c.attention_fraction * shape)
    flops = 2 * 2 * tokens * s * heads * head_dim
    passes = 4 + (3 if m.attention_dropout > 0 else 0)  # scores, softmax, (dropout), P V reads
    scores = passes * e * tokens * s * heads / (hw.hbm_gbps * 1e9 * HBM_EFFICIENCY)
    return flops / (hw.bf16_tflops * 1e12 * c.gemm_fraction * shape) + scores


def _output_layer_s(
    m: ModelConfig, padded: int, lo: ParallelLayout, hw: Hardware, c: Constants
) -> float:
    tokens = lo.micro_batch * m.seq_length / lo.context
    v = padded / lo.tensor
    gemm = _gemm_s(tokens, v, m.hidden_size, hw.bf16_tflops, c.gemm_fraction, c)
    loss = 4 * 2 * tokens * v / (hw.hbm_gbps * 1e9 * HBM_EFFICIENCY)  # softmax and its gradient
    return gemm + loss


def expected_step(
    m: ModelConfig,
    figures: ModelFigures,
    layout: ParallelLayout,
    hw: Hardware | None = None,
    constants: Constants = CONSTANTS,
) -> dict[str, float]:
    """Expected step time, throughput and where the time goes, for `layout` on `hw` (H100
    nodes when None): step_s, compute_s (the GEMMs, attention, elementwise and recompute of
    every micro-batch), tp_comm_s (exposed TP), bubble_s (pipeline fill and drain, p2p),
    dp_comm_s (exposed data-parallel traffic), optimizer_s, tokens_per_s_per_gpu,
    tflops_per_gpu (Megatron-LM's model FLOPs), mfu. `figures`: the model's for this layout's
    tensor and pipeline split (pipeline.model.figures)."""
    hw, c, lo = hw or preset(None), constants, layout
    t, p, v = lo.tensor, lo.pipeline, lo.virtual_pipeline or 1
    ffn, padded = figures.ffn_hidden_size, figures.padded_vocab
    params = figures.even_busiest_stage
    model_flops = figures.flops_per_sequence_tp1 * lo.global_batch
    layers = math.ceil(m.num_layers / p)
    compute, _, attention_fwd, tp_one = _layer_s(m, ffn, lo, hw, c)
    collectives = 8  # forward and backward: 2 all-gathers and 2 reduce-scatters each
    if lo.recompute == "full":
        recomputed = min(lo.recompute_layers or layers, layers)
        compute += compute / 3 * recomputed / layers
        collectives += 4 * recomputed / layers
    elif lo.recompute == "selective":
        compute += attention_fwd
    hidden = c.tp_overlap_hidden if lo.tp_comm_overlap else 0.0
    tp_layer = collectives * tp_one * (1 - hidden)
    micro_s = layers * compute + _output_layer_s(m, padded, lo, hw, c)
    micro_tp = layers * tp_layer
    per_micro = micro_s + micro_tp
    accum = lo.grad_accum
    bubble = (p - 1) / v * per_micro
    if p > 1 and v == 1:  # 1F1B's blocking sends: forward activation and backward gradient
        shard = t if lo.sequence_parallel else 1
        hop = lo.micro_batch * m.seq_length / lo.context * m.hidden_size * 2 / shard
        stride = t * lo.context * lo.data
        bubble += 2 * (accum + p - 1) * _collective_s(2 * hop, 2, stride, hw)
    dp_s = _data_parallel_s(params, lo, hw, per_micro)
    optimizer = _optimizer_s(params, lo, hw)
    step = accum * per_micro + bubble + dp_s + optimizer
    gpus = lo.gpus
    tflops = model_flops / step / gpus / 1e12
    tokens = lo.global_batch * m.seq_length
    return {
        "step_s": step,
        "compute_s": accum * micro_s,
        "tp_comm_s": accum * micro_tp,
        "bubble_s": bubble,
        "dp_comm_s": dp_s,
        "optimizer_s": optimizer,
        "tokens_per_s_per_gpu": tokens / step / gpus,
        "tflops_per_gpu": tflops,
        "mfu": tflops / hw.peak_tflops(lo.precision),
    }


def _data_parallel_s(params: int, lo: ParallelLayout, hw: Hardware, per_micro: float) -> float:
    """Exposed seconds of the gradient reduction and weight gathering over DP x CP ranks, of
    a stage of `params` parameters."""
    members, stride = lo.data * lo.context, lo.tensor
    if members <= 1:
        return 0.0
    grads = params * (4 if lo.grad_reduce_fp32 else 2)
    bucket = lo.bucket_params or max(BUCKET_PARAMS, 1_000_000 * members)
    buckets = math.ceil(params / bucket)
    if lo.distributed_optimizer or lo.fsdp:
        reduce = _collective_s(grads, members, stride, hw, buckets)
        gather = _collective_s(2 * params, members, stride, hw, buckets) * (2 if lo.fsdp else 1)
    else:  # an all-reduce: a reduce-scatter and an all-gather of the gradients
        reduce, gather = 2 * _collective_s(grads, members, stride, hw, buckets), 0.0
    tail = min(1.0, bucket / params)  # the last bucket waits for the end of backward
    if lo.overlap_grad_reduce:
        reduce = max(reduce - 2 / 3 * per_micro, reduce * tail)
    if lo.overlap_param_gather or lo.fsdp:
        gather = max(gather - 1 / 3 * per_micro, gather * tail)
    return reduce + gather


def _optimizer_s(params: int, lo: ParallelLayout, hw: Hardware) -> float:
    shards = lo.data * lo.context if lo.distributed_optimizer or lo.fsdp else 1
    return params / shards * OPTIMIZER_BYTES / (hw.hbm_gbps * 1e9 * HBM_EFFICIENCY)
