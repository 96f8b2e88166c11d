"""Memory per GPU of a parallel layout, following megatron-core's mixed-precision training
(bf16 weights, fp32 main gradients and Adam state, optionally sharded by the distributed
optimizer) and the activation estimates of Korthikanti et al., "Reducing Activation
Recomputation in Large Transformer Models" (2022), adapted to what Transformer Engine keeps
for backward. tests/gpu compares these with torch.cuda.max_memory_allocated().

Mixture of experts: expert weights, gradients and optimizer state are split over the expert-
parallel ranks (and expert-tensor-parallel ones), and the distributed optimizer shards them over
the expert-data-parallel ranks; a MoE layer keeps, instead of the MLP's activations, the router's
fp32 scores and the routed copies (tokens x top_k rows, as many as an even load puts on each GPU)
its grouped GEMMs and the weighting by the router's probabilities keep; the dispatcher's
permute and all-to-all buffers are a working set of one layer."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from pipeline.config import ModelConfig
from pipeline.model.figures import ModelFigures
from pipeline.planning.parallel_layout import ParallelLayout
from pipeline.planning.units import GIB

# Memory outside the per-tensor estimates: CUDA context (not seen by torch's allocator), cuBLAS
# and Transformer Engine workspaces, NCCL buffers, and the caching allocator's fragmentation.
FIXED_OVERHEAD_BYTES = int(1.5 * GIB)


def activation_dtype_bytes(layout: ParallelLayout) -> int:
    return 4 if layout.precision == "fp32" else 2  # fp8 GEMMs still take bf16 activations


def _core_attention_bytes(m: ModelConfig, layout: ParallelLayout, recompute: str) -> float:
    """What core attention keeps, per micro-batch, before tensor parallelism."""
    s, b, a = m.seq_length, layout.micro_batch, m.num_attention_heads
    if recompute == "selective":  # recomputed in backward from Q, K, V, kept anyway
        return 0.0
    if layout.fused_kernels and layout.precision != "fp32":
        return 4.0 * a * s * b  # flash attention: one fp32 log-sum-exp per head and token
    # unfused: softmax output (+ dropout mask and output): Korthikanti's 5as^2b with dropout
    e = activation_dtype_bytes(layout)
    dropout = (1 + e) if m.attention_dropout > 0 else 0
    return float((e + dropout) * a * s * s * b)


def routed_rows(m: ModelConfig, layout: ParallelLayout) -> float:
    """Token copies a GPU's experts take per micro-batch of a MoE layer under an even load: its
    tokens (a sequence-parallel share) x top_k, gathered over the expert-tensor-parallel ranks
    that split each expert."""
    seq_split = layout.tensor if layout.sequence_parallel else 1
    gathered = min(layout.expert_tensor_size, seq_split)
    return m.seq_length * layout.micro_batch * m.moe.top_k * gathered / seq_split


def _moe_mlp_bytes(
    m: ModelConfig, figures: ModelFigures, layout: ParallelLayout, gemm_input: int
) -> tuple[float, float]:
    """What a MoE layer's MLP keeps: (before sequence parallelism splits it: the router's fp32
    scores and probabilities; on one GPU: the routed rows' GEMM inputs, FC1 and activation
    outputs, the experts' outputs weighted by the probabilities in backward, and the shared
    expert's tensors)."""
    s, b, e = m.seq_length, layout.micro_batch, activation_dtype_bytes(layout)
    gated = 2 if m.activation == "swiglu" else 1
    router = 2 * 4 * s * b * m.moe.experts
    ffn = figures.expert_ffn_hidden_size / layout.expert_tensor_size
    per_row = m.hidden_size * (gemm_input + e) + ffn * (gated * e + gemm_input)
    shared = m.moe.shared_expert_ffn_hidden_size
    shared_bytes = s * b * shared * (gated * e + gemm_input) / layout.tensor
    return router, routed_rows(m, layout) * per_row + shared_bytes


def dispatch_bytes(m: ModelConfig, layout: ParallelLayout) -> int:
    """The dispatcher's buffers during one MoE layer: the permuted rows and their all-to-all copy."""
    return math.ceil(2 * activation_dtype_bytes(layout) * routed_rows(m, layout) * m.hidden_size)


def layer_activations(
    m: ModelConfig,
    figures: ModelFigures,
    layout: ParallelLayout,
    recompute: str | None = None,
    moe: bool = False,
) -> int:
    """Bytes one transformer layer keeps for backward, per micro-batch, on one GPU.

    Korthikanti et al. count s*b*h*(34 + 5*a*s/h) bytes for a GPT-3 layer (bf16, dropout, GeLU
    MLP of 4h, unfused attention), of which 10*s*b*h stay whole on every tensor-parallel rank
    unless sequence parallelism splits them. The same terms, from the shapes:
      whole (split by SP): two norm inputs, two norm outputs kept by the QKV and FC1 GEMMs,
        two dropout masks (none when hidden_dropout is 0)
      split by TP: Q, K, V (GQA: K and V have query-groups heads), the attention output (kept
        by the attention and the output projection), FC1's output (2 x ffn for SwiGLU), the
        activation's output, core attention (s^2 terms unless flash attention)
    fp8 keeps the GEMM inputs (norm outputs, activation output) as 1-byte copies, and the
    attention output once more as one. Full recompute keeps only the layer's input.
    """
    recompute = recompute or layout.recompute
    s, b, h = m.seq_length, layout.micro_batch, m.hidden_size
    e = activation_dtype_bytes(layout)
    seq_split = layout.tensor if layout.sequence_parallel else 1
    if recompute == "full":
        return math.ceil(e * s * b * h / seq_split)
    heads = m.num_attention_heads
    groups = m.num_query_groups or heads
    head_dim = figures.kv_channels
    ffn = figures.ffn_hidden_size
    fp8 = layout.precision == "fp8"
    gemm_input = 1 if fp8 else e
    masks = 2 if m.hidden_dropout > 0 else 0
    whole = s * b * h * (2 * e + 2 * gemm_input + masks)
    qkv = e * s * b * head_dim * (heads + 2 * groups)
    attention_out = s * b * heads * head_dim * (e + (1 if fp8 else 0))
    mlp = s * b * ffn * (e * (2 if m.activation == "swiglu" else 1) + gemm_input) / layout.tensor
    if moe:
        router, mlp = _moe_mlp_bytes(m, figures, layout, gemm_input)
        whole += router
    split = qkv + attention_out + _core_attention_bytes(m, layout, recompute)
    return math.ceil(whole / seq_split + split / layout.tensor + mlp)


def stage_activations(
    m: ModelConfig,
    figures: ModelFigures,
    layout: ParallelLayout,
    recompute: str | None = None,
    stage: int = 0,
) -> int:
    """One micro-batch's activations over a pipeline stage's layers (per GPU)."""
    recompute = recompute or layout.recompute
    dense, moe = figures.layer_kinds[stage]
    layers = dense + moe
    if recompute != "full":
        kept = dense * layer_activations(m, figures, layout, recompute)
        return kept + moe * layer_activations(m, figures, layout, recompute, moe=True)
    # the recomputed layers keep only their input; the rest everything (MoE layers last)
    recomputed = min(layout.recompute_layers or layers, layers)
    whole_moe = min(moe, layers - recomputed)
    whole_dense = layers - recomputed - whole_moe
    return (
        recomputed * layer_activations(m, figures, layout, "full")
        + whole_dense * layer_activations(m, figures, layout, "none")
        + whole_moe * layer_activations(m, figures, layout, "none", moe=True)
    )


def micro_batches_in_flight(layout: ParallelLayout, stage: int = 0) -> float:
    """Micro-batches whose activations a stage holds at its peak under 1F1B: the first stage
    holds PP of them, the last one; with v virtual stages, in units of a whole stage (the
    interleaved schedule's warm-up: 2(PP-1-stage) + (v-1)PP + 1 chunks of 1/v stage)."""
    p, m, v = layout.pipeline, layout.grad_accum, layout.virtual_pipeline or 1
    if p == 1:
        return 1.0
    if v == 1:
        return float(min(p - stage, m))
    chunks = min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v)
    return chunks / v


def logits_bytes(m: ModelConfig, padded: int, layout: ParallelLayout) -> int:
    """The last stage's output at the start of backward: the final norm's input and output
    (the output layer keeps it), the logits [s, b, vocab/TP], and the output layer's backward
    temporaries (its input gradient, and its weight gradient in the activation dtype before
    it is added to the fp32 main gradient). Transformer Engine's fused cross-entropy keeps the
    logits in bf16 and writes their gradient in place; the unfused one keeps an fp32 copy."""
    s, b, h = m.seq_length, layout.micro_batch, m.hidden_size
    e = activation_dtype_bytes(layout)
    seq_split = layout.tensor if layout.sequence_parallel else 1
    vocab = padded // layout.tensor
    per_logit = e if layout.fused_kernels else 4
    final_norm = 2 * e * s * b * h / seq_split
    backward = e * s * b * h + e * vocab * h
    return math.ceil(final_norm + per_logit * s * b * vocab + backward)


def static_bytes(params: Mapping[str, int], layout: ParallelLayout) -> dict[str, int]:
    """Weights, gradients and optimizer state of a GPU holding `params`.

    Mixed precision (bf16/fp16/fp8): bf16 weights, fp32 main gradients (megatron-core's DDP with
    grad_reduce_in_fp32), fp32 master weights + Adam's two fp32 moments (12 bytes/param), which
    the distributed optimizer shards over data-parallel ranks. fp8 adds Transformer Engine's
    cached fp8 weight and its transpose (2 bytes per GEMM weight). fp32: no master copy."""
    n, experts = params["total"], params.get("experts", 0)
    # megatron-core's distributed optimizer shards over the data- and context-parallel ranks,
    # the experts' state over the ranks that hold the same experts
    shards, expert_shards = layout.data * layout.context, layout.expert_data
    if not layout.distributed_optimizer:
        shards = expert_shards = 1
    weights_per, optimizer_per = (4, 8) if layout.precision == "fp32" else (2, 12)
    weights = weights_per * n
    if layout.precision == "fp8":
        weights += 2 * params["linear_weights"]
    gradients = 4 * n

    def sharded(per_param: int) -> float:
        return per_param * ((n - experts) / shards + experts / expert_shards)

    optimizer = sharded(optimizer_per)
    if layout.fsdp:  # published runs with fully sharded weights: weights and gradients too
        extra = weights - weights_per * n
        weights, gradients = sharded(weights_per) + extra / shards, sharded(4)
    return {
        "weights": math.ceil(weights),
        "gradients": math.ceil(gradients),
        "optimizer": math.ceil(optimizer),
    }


def stage_memory(
    m: ModelConfig, figures: ModelFigures, layout: ParallelLayout, stage: int
) -> dict[str, int]:
    memory = static_bytes(figures.stages[stage], layout)
    per_micro_batch = stage_activations(m, figures, layout, stage=stage)
    in_flight = micro_batches_in_flight(layout, stage)
    memory["activations"] = math.ceil(per_micro_batch * in_flight)
    last = stage == layout.pipeline - 1
    memory["logits"] = logits_bytes(m, figures.padded_vocab, layout) if last else 0
    # full recompute: the layer being recomputed holds its whole working set again
    memory["working"] = (
        layer_activations(m, figures, layout, "none") if layout.recompute == "full" else 0
    )
    if figures.layer_kinds[stage][1]:
        working = (
            layer_activations(m, figures, layout, "none", moe=True)
            if layout.recompute == "full"
            else 0
        )
        memory["working"] = max(memory["working"], working + dispatch_bytes(m, layout))
    memory["overhead"] = FIXED_OVERHEAD_BYTES
    memory["total"] = sum(memory.values())
    memory["activations_per_micro_batch"] = per_micro_batch
    memory["stage"] = stage
    return memory


def memory_per_gpu(m: ModelConfig, figures: ModelFigures, layout: ParallelLayout) -> dict[str, int]:
    """Peak bytes on the busiest GPU (the first or the last pipeline stage): weights, gradients,
    optimizer, activations (micro-batches in flight), logits, recompute working set, overhead,
    total; with activations_per_micro_batch and the stage it describes. total - overhead is
    what torch.cuda.max_memory_allocated() should report. Context parallelism splits each
    sequence over layout.context GPUs; with the embedding counted as a layer, the second stage
    holds a whole share of layers and nearly as many micro-batches as the first. `figures`:
    the model's for this layout's tensor and pipeline split (pipeline.model.figures)."""
    local = replace(m, seq_length=m.seq_length // layout.context)
    stages = {0, min(1, layout.pipeline - 1), layout.pipeline - 1}
    return max((stage_memory(local, figures, layout, s) for s in stages), key=lambda m: m["total"])
