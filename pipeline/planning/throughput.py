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
  MoE        a MoE layer's MLP: each local expert's GEMMs on the rows an even load gives it
             (tokens x top_k x EP / experts; small ones lose efficiency by the same shape rule,
             which is what a grouped GEMM pays), the shared expert, the permute and unpermute
             passes through HBM, and the dispatcher's all-to-alls (two forward, two backward, of
             tokens x top_k x hidden bytes: over NVLink inside the domain, the network beyond),
             not overlapped; the router's GEMM and top-k are left out (under 1%)
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
from pipeline.planning.memory import routed_rows
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
    # the host's work per MoE layer, micro-batch and local expert: launching its GEMMs one by
    # one (TE's grouped linear), its casts and the dispatcher's kernels (expected_step)
    moe_expert_overhead_ms: float = 0.275


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


def _all_to_all_s(m: ModelConfig, rows: float, lo: ParallelLayout, hw: Hardware, e: int) -> float:
    """One all-to-all of the dispatcher: each of the EP ranks (expert-TP ranks apart) sends its
    `rows` routed copies, an equal share to each rank: the shares for ranks in the NVLink domain
    over NVLink, the others over the network, both at once. A deduplicating dispatcher
    (HybridEP, DeepEP) sends a token once to each other domain holding one of its experts."""
    members, stride, h = lo.expert, lo.expert_tensor_size, m.hidden_size
    if members <= 1:
        return 0.0
    in_domain = max(1, min(members, hw.nvlink_domain // stride))
    nvlink = (in_domain - 1) / members * rows * h * e / (hw.nvlink_gbps * 1e9 * NCCL_EFFICIENCY)
    remote = (members - in_domain) / members * rows
    if lo.ep_dedup and members > in_domain:
        domains, k = members / in_domain, m.moe.top_k
        remote = min(remote, rows / k * (domains - 1) * (1 - (1 - 1 / domains) ** k))
    network = remote * h * e / (hw.network_gbps * 1e9 * NCCL_EFFICIENCY)
    latency = NETWORK_LATENCY_US if members > in_domain else hw.latency_us
    return max(nvlink, network) + latency * 1e-6


def _experts_s(
    m: ModelConfig,
    figures: ModelFigures,
    lo: ParallelLayout,
    hw: Hardware,
    c: Constants,
    peak: float,
    fraction: float,
) -> tuple[float, float]:
    """A MoE layer's MLP on one GPU, one micro-batch: (its GEMMs forward and backward: the
    local experts' on the rows an even load gives each, and the shared expert's; one
    all-to-all of its routed rows) in seconds."""
    rows, experts = routed_rows(m, lo) / lo.context, m.moe.experts
    local = experts / lo.expert
    per_expert = rows / local
    ffn, etp = figures.expert_ffn_hidden_size, lo.expert_tensor_size
    gated = 2 if m.activation == "swiglu" else 1
    h = m.hidden_size
    gemms = local * (
        _gemm_s(per_expert, gated * ffn / etp, h, peak, fraction, c)
        + _gemm_s(per_expert, h, ffn / etp, peak, fraction, c)
    )
    shared = m.moe.shared_expert_ffn_hidden_size
    if shared:
        tokens = lo.micro_batch * m.seq_length / lo.context
        gemms += _gemm_s(tokens, gated * shared / lo.tensor, h, peak, fraction, c)
        gemms += _gemm_s(tokens, h, shared / lo.tensor, peak, fraction, c)
    e = 4 if lo.precision == "fp32" else 2
    a2a = _all_to_all_s(m, rows, lo, hw, e)
    return gemms, a2a


def _layer_s(
    m: ModelConfig,
    figures: ModelFigures,
    lo: ParallelLayout,
    hw: Hardware,
    c: Constants,
    moe: bool = False,
) -> tuple[float, float, float, float, float]:
    """One layer (`moe`: a MoE layer's experts), one micro-batch, one GPU:
    (forward + backward compute, its elementwise part, forward attention, one forward TP
    collective, one all-to-all of the dispatcher) in seconds."""
    t, tokens = lo.tensor, lo.micro_batch * m.seq_length / lo.context
    h, heads = m.hidden_size, m.num_attention_heads
    groups, head_dim = m.num_query_groups or heads, figures.kv_channels
    ffn = figures.ffn_hidden_size
    gated = m.activation == "swiglu"
    fp8 = lo.precision == "fp8" and hw.fp8
    peak = hw.peak_tflops("fp8" if fp8 else "bf16")
    fraction = c.fp8_gemm_fraction if fp8 else c.gemm_fraction
    gemms = _gemm_s(tokens, head_dim * (heads + 2 * groups) / t, h, peak, fraction, c)  # QKV
    gemms += _gemm_s(tokens, h, heads * head_dim / t, peak, fraction, c)  # output projection
    a2a = 0.0
    if moe:
        experts, a2a = _experts_s(m, figures, lo, hw, c, peak, fraction)
        gemms += experts
    else:
        gemms += _gemm_s(tokens, ffn * (2 if gated else 1) / t, h, peak, fraction, c)  # FC1
        gemms += _gemm_s(tokens, h, ffn / t, peak, fraction, c)  # FC2
    e = 4 if lo.precision == "fp32" else 2
    attention_fwd = _attention_fwd_s(m, figures.kv_channels, lo, hw, c, tokens, e)
    whole = 10 * h * e  # two norms (read, write) and two residual adds (two reads, a write)
    if m.hidden_dropout > 0:  # two dropouts: read, write and a mask byte each
        whole += 2 * (2 * e + 1) * h
    if moe:  # the routed rows' activation, and the shared expert's
        ffn = m.moe.top_k * figures.expert_ffn_hidden_size + m.moe.shared_expert_ffn_hidden_size
    split = (2 * (heads + groups) * head_dim + (3 if gated else 2) * ffn) * e  # RoPE, activation
    if fp8:  # casts of the four GEMM inputs and the gradients to fp8
        split += 3 * (h + ffn) * e
    seq_split = t if lo.sequence_parallel else 1
    if moe:  # permute and unpermute (each a read and a write); with EP, two chunk sorts more
        passes = 2 + 2 * m.moe.top_k + (4 * m.moe.top_k if lo.expert > 1 else 0)
        whole += passes * h * e
    per_token = 3 * (whole / seq_split + split / t)  # backward moves about twice forward's bytes
    elementwise = per_token * tokens / (hw.hbm_gbps * 1e9 * HBM_EFFICIENCY)
    compute = gemms + 3.5 * attention_fwd + elementwise + c.layer_overhead_ms * 1e-3
    tp_one = _collective_s(tokens * h * e, t, 1, hw) if t > 1 else 0.0
    return compute, elementwise, attention_fwd, tp_one, a2a


def _attention_fwd_s(
    m: ModelConfig,
    head_dim: int,
    lo: ParallelLayout,
    hw: Hardware,
    c: Constants,
    tokens: float,
    e: int,
) -> float:
    """Core attention's forward on one GPU, heads `head_dim` wide (backward: 2.5 times it). Flash attention computes
    the causal half of Q K^T and P V at a fraction of the bf16 peak that falls with the head
    dimension (the matmuls' inner size); unfused attention multiplies the whole s x s matrix
    and writes the scores, the softmax (and its dropout) through HBM."""
    heads = m.num_attention_heads / lo.tensor
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
    padded = figures.padded_vocab
    params = figures.even_busiest_stage
    model_flops = figures.flops_per_sequence_tp1 * lo.global_batch
    layers = math.ceil(m.num_layers / p)
    # the busiest stage's layers: the last ones, MoE layers where the model has them
    moe = min(layers, figures.layer_kinds[p - 1][1])
    compute, _, attention_fwd, tp_one, _ = _layer_s(m, figures, lo, hw, c)
    all_to_all = stall = 0.0  # per layer, averaged over the stage's layers
    if moe:
        moe_compute, _, _, _, a2a = _layer_s(m, figures, lo, hw, c, moe=True)
        # the host's work for a MoE layer (launching its many small kernels): the dispatcher's
        # sync on the tokens per expert makes the GPU wait for it; without one the host runs
        # ahead and it only bounds the layer from below
        local = m.moe.experts / lo.expert
        host = c.moe_expert_overhead_ms * local * 1e-3
        if lo.dispatcher_host_sync:
            stall = host * moe / layers
        else:
            moe_compute = max(moe_compute, host)
        compute = ((layers - moe) * compute + moe * moe_compute) / layers
        all_to_all = 4 * a2a * moe / layers  # dispatch and combine, forward and backward
        if lo.ep_comm_overlap:
            all_to_all *= 1 - c.tp_overlap_hidden
    collectives = 8  # forward and backward: 2 all-gathers and 2 reduce-scatters each
    if lo.recompute == "full":  # the forward once more, with its all-to-alls and stalls
        recomputed = min(lo.recompute_layers or layers, layers)
        compute += compute / 3 * recomputed / layers
        collectives += 4 * recomputed / layers
        all_to_all *= 1 + recomputed / layers / 2
        stall *= 1 + recomputed / layers
    elif lo.recompute == "selective":
        compute += attention_fwd
    compute += stall
    hidden = c.tp_overlap_hidden if lo.tp_comm_overlap else 0.0
    tp_layer = collectives * tp_one * (1 - hidden)
    micro_s = layers * compute + _output_layer_s(m, padded, lo, hw, c)
    micro_tp = layers * tp_layer
    micro_a2a = layers * all_to_all
    per_micro = micro_s + micro_tp + micro_a2a
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
        "ep_comm_s": accum * micro_a2a,
        "bubble_s": bubble,
        "dp_comm_s": dp_s,
        "optimizer_s": optimizer,
        "tokens_per_s_per_gpu": tokens / step / gpus,
        "tflops_per_gpu": tflops,
        "mfu": tflops / hw.peak_tflops(lo.precision),
    }


def _data_parallel_s(
    params: dict[str, int], lo: ParallelLayout, hw: Hardware, per_micro: float
) -> float:
    """Exposed seconds of the gradient reduction and weight gathering of a stage's `params`
    (stage_params): over the DP x CP ranks, and for a MoE model's experts over the
    expert-data-parallel ranks that hold the same experts."""
    total, experts = params["total"], params.get("experts", 0)
    groups = [(total - experts, lo.data * lo.context, lo.tensor)]
    if experts:
        groups.append((experts, lo.expert_data, lo.expert_tensor_size * lo.expert))
    reduce = gather = 0.0
    for count, members, stride in groups:
        if members <= 1 or not count:
            continue
        grads = count * (4 if lo.grad_reduce_fp32 else 2)
        bucket = lo.bucket_params or max(BUCKET_PARAMS, 1_000_000 * members)
        buckets = math.ceil(count / bucket)
        if lo.distributed_optimizer or lo.fsdp:
            reduce += _collective_s(grads, members, stride, hw, buckets)
            gather += _collective_s(2 * count, members, stride, hw, buckets) * (1 + lo.fsdp)
        else:  # an all-reduce: a reduce-scatter and an all-gather of the gradients
            reduce += 2 * _collective_s(grads, members, stride, hw, buckets)
    bucket = lo.bucket_params or max(BUCKET_PARAMS, 1_000_000 * lo.data * lo.context)
    tail = min(1.0, bucket / total)  # the last bucket waits for the end of backward
    if lo.overlap_grad_reduce:
        reduce = max(reduce - 2 / 3 * per_micro, reduce * tail)
    if lo.overlap_param_gather or lo.fsdp:
        gather = max(gather - 1 / 3 * per_micro, gather * tail)
    return reduce + gather


def _optimizer_s(params: dict[str, int], lo: ParallelLayout, hw: Hardware) -> float:
    """The optimizer's pass over its shard: the dense parameters' and the experts'."""
    experts = params.get("experts", 0)
    sharded = lo.distributed_optimizer or lo.fsdp
    shards, expert_shards = (lo.data * lo.context, lo.expert_data) if sharded else (1, 1)
    per_gpu = (params["total"] - experts) / shards + experts / expert_shards
    return per_gpu * OPTIMIZER_BYTES / (hw.hbm_gbps * 1e9 * HBM_EFFICIENCY)
