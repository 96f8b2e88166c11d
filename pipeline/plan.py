"""Plan a run before it is submitted: parameters, FLOPs, memory per GPU, time, and layouts.

    python -m pipeline.plan [overrides] [--search] [--gpu-memory GB] [--gpus N] [--gpu NAME]
                            [--tokens N] [--mfu F]

Pure arithmetic on the composed config: nothing is built, no torch. The parameter count equals
megatron-core's GPTModel as `pipeline.model.build` makes it; FLOPs are Megatron-LM's
(`pipeline.flops`); memory follows megatron-core's mixed-precision training (bf16 weights, fp32
main gradients and Adam state, optionally sharded by the distributed optimizer) and the
activation estimates of Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (2022), adapted to what Transformer Engine keeps for backward.
The plan-only flags are taken off the command line before Hydra sees it (`plan.KEY=VALUE`
works too), so the config schema is untouched.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import sys
from dataclasses import dataclass, field, replace

from omegaconf import DictConfig

from pipeline import config as config_schema
from pipeline import files
from pipeline.config import ConfigError, data_parallel_size, slurm_minutes, world_size
from pipeline.flops import flops_per_sequence, peak_tflops
from pipeline.layout import RunLayout
from pipeline.model import ffn_hidden_size

GIB = 2**30

# Memory outside the per-tensor estimates: CUDA context (not seen by torch's allocator), cuBLAS
# and Transformer Engine workspaces, NCCL buffers, and the caching allocator's fragmentation.
FIXED_OVERHEAD_BYTES = int(1.5 * GIB)

# What the nominal sizes report as device memory (MiB); other sizes are taken as GiB.
DEVICE_MIB = {24: 24576, 40: 40960, 80: 81559, 141: 143771}
# The GPU assumed for a memory size when none is named (for its peak FLOP/s).
GPU_BY_MEMORY = {40: "A100", 80: "H100", 141: "H200"}
# Known GPUs by the name users give in cluster.gpu: memory (GB, as sold) and compute capability.
# fp8 tensor cores need compute capability 8.9 (Ada) or newer (Hopper 9.0, Blackwell 10.0).
GPUS = {
    "H200": (141, (9, 0)), "H100": (80, (9, 0)), "GH200": (96, (9, 0)), "B200": (180, (10, 0)),
    "A100": (80, (8, 0)), "A100-40GB": (40, (8, 0)), "L40S": (48, (8, 9)), "L4": (24, (8, 9)),
    "A10": (24, (8, 6)), "V100": (32, (7, 0)),
}  # fmt: skip
FP8_CAPABILITY = (8, 9)
# Time a saving job needs besides writing: agreeing on the signal, finishing the step, syncing.
SAVE_MARGIN_S = 10.0

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

RECOMPUTE_MODES = ("none", "selective", "full")


# --- parameters ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """Parameters split across tensor-parallel ranks (sharded) or held whole by each rank."""

    sharded: int = 0
    replicated: int = 0

    @property
    def total(self) -> int:
        return self.sharded + self.replicated

    def per_rank(self, tensor: int) -> int:
        return self.sharded // tensor + self.replicated

    def __add__(self, other: Part) -> Part:
        return Part(self.sharded + other.sharded, self.replicated + other.replicated)

    def __mul__(self, n: int) -> Part:
        return Part(self.sharded * n, self.replicated * n)


def padded_vocab(vocab_size: int, cfg: DictConfig, tensor: int) -> int:
    """megatron's padding: a multiple of make_vocab_size_divisible_by x tensor-parallel size."""
    multiple = cfg.model.make_vocab_size_divisible_by * tensor
    return -(-vocab_size // multiple) * multiple


def _linear(fan_in: int, fan_out: int, bias: bool, row_parallel: bool) -> Part:
    """A column-parallel linear shards weight and bias; a row-parallel one keeps its bias whole."""
    weight = Part(sharded=fan_in * fan_out)
    if not bias:
        return weight
    return weight + (Part(replicated=fan_out) if row_parallel else Part(sharded=fan_out))


def _norm(cfg: DictConfig) -> Part:
    h = cfg.model.hidden_size
    return Part(replicated=2 * h if cfg.model.normalization == "LayerNorm" else h)


def attention_params(cfg: DictConfig) -> Part:
    m = cfg.model
    kv_channels = m.hidden_size // m.num_attention_heads
    groups = m.num_query_groups or m.num_attention_heads
    qkv_width = kv_channels * (m.num_attention_heads + 2 * groups)
    query_width = kv_channels * m.num_attention_heads
    bias = m.add_bias_linear
    return _linear(m.hidden_size, qkv_width, bias, False) + _linear(
        query_width, m.hidden_size, bias, True
    )


def mlp_params(cfg: DictConfig) -> Part:
    m = cfg.model
    ffn = ffn_hidden_size(m)
    fc1_width = 2 * ffn if m.activation == "swiglu" else ffn  # gate and up projections stacked
    bias = m.add_bias_linear
    return _linear(m.hidden_size, fc1_width, bias, False) + _linear(ffn, m.hidden_size, bias, True)


def linear_weights(cfg: DictConfig) -> int:
    """Weights of one layer's four GEMMs, biases left out (what fp8 casts)."""
    m = cfg.model
    heads = m.num_attention_heads
    groups = m.num_query_groups or heads
    head_dim = m.hidden_size // heads
    ffn = ffn_hidden_size(m)
    fc1_width = 2 * ffn if m.activation == "swiglu" else ffn
    qkv = m.hidden_size * head_dim * (heads + 2 * groups)
    return qkv + head_dim * heads * m.hidden_size + (fc1_width + ffn) * m.hidden_size


def layer_params(cfg: DictConfig) -> dict[str, Part]:
    """One transformer layer: attention, MLP, and its two norms (fused into the next linear by
    Transformer Engine; the same count)."""
    return {"attention": attention_params(cfg), "mlp": mlp_params(cfg), "norms": _norm(cfg) * 2}


def embedding_params(cfg: DictConfig, vocab_size: int, tensor: int) -> dict[str, Part]:
    m = cfg.model
    word = Part(sharded=padded_vocab(vocab_size, cfg, tensor) * m.hidden_size)
    position = Part()
    if m.position_embedding == "learned_absolute":  # a plain embedding, whole on every rank
        position = Part(replicated=(m.max_position_embeddings or m.seq_length) * m.hidden_size)
    return {"word": word, "position": position}


def output_params(cfg: DictConfig, vocab_size: int, tensor: int, pipeline: int = 1) -> Part:
    """The output layer: its own weight when untied; with tied embeddings, a copy on the last
    pipeline stage when the first stage is another GPU, and nothing otherwise."""
    if cfg.model.untie_embeddings or pipeline > 1:
        return Part(sharded=padded_vocab(vocab_size, cfg, tensor) * cfg.model.hidden_size)
    return Part()


def parameter_count(cfg: DictConfig, vocab_size: int, tensor: int | None = None) -> dict[str, int]:
    """Parameters of one model replica, as pipeline.model.count_parameters reports them
    (embedding, transformer, output_layer, total), with the breakdown beside them."""
    tensor = tensor or cfg.parallel.tensor
    layers = cfg.model.num_layers
    layer = layer_params(cfg)
    per_layer = sum(p.total for p in layer.values())
    embedding = embedding_params(cfg, vocab_size, tensor)
    final_norm = _norm(cfg).total
    counts = {
        "padded_vocab": padded_vocab(vocab_size, cfg, tensor),
        "word_embedding": embedding["word"].total,
        "position_embedding": embedding["position"].total,
        "embedding": embedding["word"].total + embedding["position"].total,
        "attention_per_layer": layer["attention"].total,
        "mlp_per_layer": layer["mlp"].total,
        "norms_per_layer": layer["norms"].total,
        "layer": per_layer,
        "final_norm": final_norm,
        "transformer": per_layer * layers + final_norm,
        "output_layer": output_params(cfg, vocab_size, tensor).total,
    }
    counts["total"] = counts["embedding"] + counts["transformer"] + counts["output_layer"]
    return counts


def stage_params(
    cfg: DictConfig, vocab_size: int, tensor: int, pipeline: int, stage: int
) -> dict[str, int]:
    """Parameters on one GPU of a pipeline stage (one tensor-parallel rank): its share of the
    layers, the embedding on the first stage, final norm and output layer on the last."""
    layers = cfg.model.num_layers // pipeline
    transformer = sum(layer_params(cfg).values(), Part()) * layers
    embedding = output = Part()
    if stage == 0:
        embedding = sum(embedding_params(cfg, vocab_size, tensor).values(), Part())
    if stage == pipeline - 1:
        transformer = transformer + _norm(cfg)
        output = output_params(cfg, vocab_size, tensor, pipeline)
    counts = {
        "embedding": embedding.per_rank(tensor),
        "transformer": transformer.per_rank(tensor),
        "output_layer": output.per_rank(tensor),
        "linear_weights": linear_weights(cfg) * layers // tensor,
    }
    counts["total"] = counts["embedding"] + counts["transformer"] + counts["output_layer"]
    return counts


# --- layout -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    micro_batch: int = 1
    grad_accum: int = 1
    recompute: str = "none"  # none | selective | full
    recompute_layers: int | None = None  # full recompute: layers recomputed per stage
    virtual_pipeline: int | None = None
    sequence_parallel: bool = False
    distributed_optimizer: bool = True
    overlap_grad_reduce: bool = False
    precision: str = "bf16"
    # The GPU backend: Transformer Engine's flash attention and fused cross-entropy.
    fused_kernels: bool = True

    @property
    def gpus(self) -> int:
        return self.tensor * self.pipeline * self.data

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.data * self.grad_accum

    @classmethod
    def of(cls, cfg: DictConfig) -> Layout:
        """The layout a validated config describes."""
        p, t = cfg.parallel, cfg.train
        return cls(
            tensor=p.tensor,
            pipeline=p.pipeline,
            data=data_parallel_size(cfg),
            micro_batch=t.micro_batch_size,
            grad_accum=t.grad_accum,
            recompute=t.recompute,
            recompute_layers=t.recompute_layers,
            virtual_pipeline=p.virtual_pipeline,
            sequence_parallel=p.sequence_parallel,
            distributed_optimizer=p.distributed_optimizer,
            overlap_grad_reduce=p.overlap_grad_reduce,
            precision=t.precision,
            fused_kernels=on_gpu(cfg),
        )

    def describe(self) -> str:
        vp = f" (x{self.virtual_pipeline} virtual)" if self.virtual_pipeline else ""
        sp = ", sequence parallel" if self.sequence_parallel else ""
        return (
            f"TP={self.tensor} PP={self.pipeline}{vp} DP={self.data}, micro-batch "
            f"{self.micro_batch} x accumulation {self.grad_accum}, recompute {self.recompute}"
            f"{sp}, {self.precision}"
        )


def on_gpu(cfg: DictConfig) -> bool:
    device = cfg.train.device
    return device == "cuda" or (device == "auto" and cfg.cluster.gpus_per_node > 0)


# --- memory -------------------------------------------------------------------------------------


def _activation_dtype_bytes(layout: Layout) -> int:
    return 4 if layout.precision == "fp32" else 2  # fp8 GEMMs still take bf16 activations


def _core_attention_bytes(cfg: DictConfig, layout: Layout, recompute: str) -> float:
    """What core attention keeps, per micro-batch, before tensor parallelism."""
    m = cfg.model
    s, b, a = m.seq_length, layout.micro_batch, m.num_attention_heads
    if recompute == "selective":  # recomputed in backward from Q, K, V, kept anyway
        return 0.0
    if layout.fused_kernels and layout.precision != "fp32":
        return 4.0 * a * s * b  # flash attention: one fp32 log-sum-exp per head and token
    # unfused: softmax output (+ dropout mask and output): Korthikanti's 5as^2b with dropout
    e = _activation_dtype_bytes(layout)
    dropout = (1 + e) if m.attention_dropout > 0 else 0
    return float((e + dropout) * a * s * s * b)


def layer_activations(cfg: DictConfig, layout: Layout, recompute: str | None = None) -> int:
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
    m = cfg.model
    recompute = recompute or layout.recompute
    s, b, h = m.seq_length, layout.micro_batch, m.hidden_size
    e = _activation_dtype_bytes(layout)
    seq_split = layout.tensor if layout.sequence_parallel else 1
    if recompute == "full":
        return math.ceil(e * s * b * h / seq_split)
    heads = m.num_attention_heads
    groups = m.num_query_groups or heads
    head_dim = h // heads
    ffn = ffn_hidden_size(m)
    fp8 = layout.precision == "fp8"
    gemm_input = 1 if fp8 else e
    masks = 2 if m.hidden_dropout > 0 else 0
    whole = s * b * h * (2 * e + 2 * gemm_input + masks)
    qkv = e * s * b * head_dim * (heads + 2 * groups)
    attention_out = s * b * heads * head_dim * (e + (1 if fp8 else 0))
    fc1_out = e * s * b * ffn * (2 if m.activation == "swiglu" else 1)
    act_out = gemm_input * s * b * ffn
    split = qkv + attention_out + fc1_out + act_out + _core_attention_bytes(cfg, layout, recompute)
    return math.ceil(whole / seq_split + split / layout.tensor)


def stage_activations(cfg: DictConfig, layout: Layout, recompute: str | None = None) -> int:
    """One micro-batch's activations over a pipeline stage's layers (per GPU)."""
    recompute = recompute or layout.recompute
    layers = cfg.model.num_layers // layout.pipeline
    if recompute != "full":
        return layers * layer_activations(cfg, layout, recompute)
    recomputed = min(layout.recompute_layers or layers, layers)
    return recomputed * layer_activations(cfg, layout, "full") + (
        layers - recomputed
    ) * layer_activations(cfg, layout, "none")


def micro_batches_in_flight(layout: Layout, stage: int = 0) -> float:
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


def logits_bytes(cfg: DictConfig, vocab_size: int, layout: Layout) -> int:
    """The last stage's output at the start of backward: the final norm's input and output
    (the output layer keeps it), the logits [s, b, vocab/TP], and the output layer's backward
    temporaries (its input gradient, and its weight gradient in the activation dtype before
    it is added to the fp32 main gradient). Transformer Engine's fused cross-entropy keeps the
    logits in bf16 and writes their gradient in place; the unfused one keeps an fp32 copy."""
    m = cfg.model
    s, b, h = m.seq_length, layout.micro_batch, m.hidden_size
    e = _activation_dtype_bytes(layout)
    seq_split = layout.tensor if layout.sequence_parallel else 1
    vocab = padded_vocab(vocab_size, cfg, layout.tensor) // layout.tensor
    per_logit = e if layout.fused_kernels else 4
    final_norm = 2 * e * s * b * h / seq_split
    backward = e * s * b * h + e * vocab * h
    return math.ceil(final_norm + per_logit * s * b * vocab + backward)


def static_bytes(params: dict[str, int], layout: Layout) -> dict[str, int]:
    """Weights, gradients and optimizer state of a GPU holding `params`.

    Mixed precision (bf16/fp16/fp8): bf16 weights, fp32 main gradients (megatron-core's DDP with
    grad_reduce_in_fp32), fp32 master weights + Adam's two fp32 moments (12 bytes/param), which
    the distributed optimizer shards over data-parallel ranks. fp8 adds Transformer Engine's
    cached fp8 weight and its transpose (2 bytes per GEMM weight). fp32: no master copy."""
    n = params["total"]
    shards = layout.data if layout.distributed_optimizer else 1
    if layout.precision == "fp32":
        weights, optimizer = 4 * n, 8 * n
    else:
        weights, optimizer = 2 * n, 12 * n
        if layout.precision == "fp8":
            weights += 2 * params["linear_weights"]
    return {"weights": weights, "gradients": 4 * n, "optimizer": math.ceil(optimizer / shards)}


def stage_memory(cfg: DictConfig, vocab_size: int, layout: Layout, stage: int) -> dict[str, int]:
    params = stage_params(cfg, vocab_size, layout.tensor, layout.pipeline, stage)
    memory = static_bytes(params, layout)
    per_micro_batch = stage_activations(cfg, layout)
    in_flight = micro_batches_in_flight(layout, stage)
    memory["activations"] = math.ceil(per_micro_batch * in_flight)
    last = stage == layout.pipeline - 1
    memory["logits"] = logits_bytes(cfg, vocab_size, layout) if last else 0
    # full recompute: the layer being recomputed holds its whole working set again
    memory["working"] = layer_activations(cfg, layout, "none") if layout.recompute == "full" else 0
    memory["overhead"] = FIXED_OVERHEAD_BYTES
    memory["total"] = sum(memory.values())
    memory["activations_per_micro_batch"] = per_micro_batch
    memory["stage"] = stage
    return memory


def memory_per_gpu(
    cfg: DictConfig, vocab_size: int, layout: Layout | None = None
) -> dict[str, int]:
    """Peak bytes on the busiest GPU (the first or the last pipeline stage): weights, gradients,
    optimizer, activations (micro-batches in flight), logits, recompute working set, overhead,
    total; with activations_per_micro_batch and the stage it describes. total - overhead is
    what torch.cuda.max_memory_allocated() should report."""
    layout = layout or Layout.of(cfg)
    stages = {0, layout.pipeline - 1}
    return max((stage_memory(cfg, vocab_size, layout, s) for s in stages), key=lambda m: m["total"])


def gpu_capacity_bytes(gpu_memory_gb: float) -> int:
    mib = DEVICE_MIB.get(int(gpu_memory_gb)) if gpu_memory_gb == int(gpu_memory_gb) else None
    return mib * 2**20 if mib else int(gpu_memory_gb * GIB)


# --- time ---------------------------------------------------------------------------------------


def tokens_per_step(cfg: DictConfig) -> int:
    return cfg.train.global_batch_size * cfg.model.seq_length


def steps_for(tokens: float, cfg: DictConfig) -> int:
    return math.ceil(tokens / tokens_per_step(cfg))


def wall_seconds(
    cfg: DictConfig, vocab_size: int, steps: int, gpus: int, peak: float, mfu: float
) -> float:
    """Seconds for `steps` at a model-FLOPs utilisation `mfu` of `peak` TFLOP/s per GPU."""
    flops = flops_per_sequence(cfg, vocab_size) * cfg.train.global_batch_size * steps
    return flops / (gpus * peak * 1e12 * mfu)


def _allreduce_seconds(nbytes: float, ranks: int, gbps: float) -> float:
    return 2 * (ranks - 1) / ranks * nbytes / (gbps * 1e9) if ranks > 1 else 0.0


def expected_step(
    cfg: DictConfig,
    vocab_size: int,
    layout: Layout,
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
    model_flops_mb = flops_per_sequence(cfg, vocab_size) * b / (t * p)
    compute = model_flops_mb * RECOMPUTE_COST[layout.recompute] / (peak_flops * mfu * gemm)
    tp_gbps = NVLINK_GBPS if t <= gpus_per_node else NETWORK_GBPS
    collectives = 6 if layout.recompute == "full" else 4
    hidden_bytes = _activation_dtype_bytes(layout) * tokens * m.hidden_size
    tp_comm = (m.num_layers // p) * collectives * _allreduce_seconds(hidden_bytes, t, tp_gbps)
    bubble = (p - 1) / (layout.virtual_pipeline or 1)
    pipeline_s = (compute + tp_comm) * (layout.grad_accum + bubble)
    params = max(stage_params(cfg, vocab_size, t, p, stage)["total"] for stage in {0, p - 1})
    # as all-reduce volume: fp32 gradients reduce-scattered and bf16 weights all-gathered by the
    # distributed optimizer (together half of 4 + 2 bytes), or fp32 gradients all-reduced
    grad_bytes = (4 + 2) / 2 * params if layout.distributed_optimizer else 4 * params
    dp_gbps = NVLINK_GBPS if t * dp <= gpus_per_node else NETWORK_GBPS
    dp_comm = _allreduce_seconds(grad_bytes, dp, dp_gbps) * DP_EXPOSED[layout.overlap_grad_reduce]
    step = pipeline_s + dp_comm
    gpus = layout.gpus
    step_flops = flops_per_sequence(cfg, vocab_size) * layout.global_batch
    return {
        "step_s": step,
        "compute_s": compute * layout.grad_accum,
        "tp_comm_s": tp_comm * layout.grad_accum,
        "bubble_s": (compute + tp_comm) * bubble,
        "dp_comm_s": dp_comm,
        "mfu": step_flops / gpus / (step * peak_flops),
        "tokens_per_s_per_gpu": layout.global_batch * s / step / gpus,
    }


# --- checks before submission -------------------------------------------------------------------


def gpu_memory_gb(cfg: DictConfig) -> float | None:
    """The training GPUs' memory: cluster.gpu_memory_gb, else that of a known cluster.gpu."""
    c = cfg.cluster
    if c.gpu_memory_gb:
        return float(c.gpu_memory_gb)
    known = GPUS.get(str(c.gpu or "").upper())
    return float(known[0]) if known else None


def checkpoint_bytes(cfg: DictConfig, vocab_size: int) -> int:
    """What one save writes over all ranks: weights and optimizer state (fp32 main weights and
    two Adam moments in mixed precision), whatever the layout."""
    n = parameter_count(cfg, vocab_size)["total"]
    return n * (12 if cfg.train.precision == "fp32" else 14)


def _local_gpu() -> bool:
    """Whether this machine has an NVIDIA GPU, without importing torch (seconds)."""
    return os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi") is not None


def _check_device(cfg: DictConfig) -> None:
    t = cfg.train
    # an evaluation alone runs in fp32 on a CPU, whatever precision trained the weights
    if not on_gpu(cfg) and t.precision != "fp32" and "train" in cfg.stages:
        raise ConfigError(
            f"train.precision: {t.precision} needs GPUs (cluster.gpus_per_node); use fp32 on CPU"
        )
    if not on_gpu(cfg) and cfg.parallel.sequence_parallel:
        raise ConfigError("parallel.sequence_parallel: needs GPUs; use false on CPU")
    if not on_gpu(cfg) and cfg.parallel.pipeline > 1 and not cfg.model.untie_embeddings:
        raise ConfigError(
            "parallel.pipeline: pipeline stages on CPU need model.untie_embeddings=true "
            "(megatron-core keeps the output copy of a tied embedding on a GPU)"
        )
    if on_gpu(cfg) and cfg.cluster.executor != "slurm" and not _local_gpu():
        raise ConfigError(
            "train.device: GPUs asked for (train=gpu or cluster.gpus_per_node), but this "
            "machine has none; use train=cpu here, or cluster=slurm to submit to GPU nodes"
        )


def _check_fp8(cfg: DictConfig) -> None:
    if cfg.train.precision != "fp8":
        return
    gpu = str(cfg.cluster.gpu or "").upper()
    if gpu in GPUS and GPUS[gpu][1] < FP8_CAPABILITY:
        cc = ".".join(map(str, GPUS[gpu][1]))
        raise ConfigError(
            f"train.precision: fp8 needs compute capability 8.9 or newer (Ada, Hopper, "
            f"Blackwell); cluster.gpu={cfg.cluster.gpu} is {cc}: use bf16"
        )


def _check_fits(cfg: DictConfig, vocab_size: int) -> None:
    memory_gb = gpu_memory_gb(cfg)
    if memory_gb is None or not on_gpu(cfg):
        return
    need = memory_per_gpu(cfg, vocab_size)["total"]
    capacity = gpu_capacity_bytes(memory_gb)
    if need <= capacity:
        return
    found = search_layouts(cfg, vocab_size, world_size(cfg), memory_gb, cfg.cluster.gpus_per_node)
    if found.feasible:
        lo = found.feasible[0].layout
        hint = (
            f"the best layout that fits: parallel.tensor={lo.tensor} "
            f"parallel.pipeline={lo.pipeline} train.micro_batch_size={lo.micro_batch} "
            f"train.recompute={lo.recompute}"
            + (" parallel.sequence_parallel=true" if lo.sequence_parallel else "")
        )
    else:
        hint = f"no layout of {world_size(cfg)} GPUs fits: use more GPUs"
    raise ConfigError(
        f"train.micro_batch_size: {Layout.of(cfg).describe()} needs ~{_gib(need)} per GPU, "
        f"more than the {memory_gb:g} GB of each GPU; {hint} (python -m pipeline.plan --search)"
    )


def _check_time_limit(cfg: DictConfig, vocab_size: int) -> None:
    """The warning signal must leave time to finish the step and save; the limit must leave
    time to train before the signal."""
    if cfg.cluster.executor != "slurm":
        return
    t, c = cfg.train, cfg.cluster
    # written once, then read back once for its checksums (COMPLETE.json), at about that rate
    save_s = 2 * checkpoint_bytes(cfg, vocab_size) / (c.checkpoint_write_gbps * 1e9)
    step_s = expected_step(cfg, vocab_size, Layout.of(cfg))["step_s"] if on_gpu(cfg) else 0.0
    need = save_s + step_s + SAVE_MARGIN_S
    if t.exit_signal_lead_s < need:
        raise ConfigError(
            f"train.exit_signal_lead_s: {t.exit_signal_lead_s} s may not be enough to finish a "
            f"step (~{step_s:.0f} s) and save {_gib(checkpoint_bytes(cfg, vocab_size))} "
            f"(~{save_s:.0f} s at cluster.checkpoint_write_gbps={c.checkpoint_write_gbps:g}); "
            f"set at least {math.ceil(need)}"
        )
    limit_s = slurm_minutes(c.time_limit, "cluster.time_limit") * 60
    if limit_s <= t.exit_signal_lead_s + need:
        raise ConfigError(
            f"cluster.time_limit: {c.time_limit} leaves no time to train before the save "
            f"signal {t.exit_signal_lead_s} s before the end; make it longer"
        )


def preflight(cfg: DictConfig, vocab_size: int) -> None:
    """What would otherwise fail after hours in the queue, refused before anything is
    submitted: GPU settings without GPUs, fp8 without fp8 tensor cores, a layout that does not fit the GPUs' memory, a
    time limit or signal lead too short to save a checkpoint. Raises ConfigError."""
    _check_device(cfg)
    _check_fp8(cfg)
    _check_fits(cfg, vocab_size)
    _check_time_limit(cfg, vocab_size)
    _check_resume_layout(cfg)


RESUME_KEYS = ("tensor", "pipeline", "virtual_pipeline")


def resume_layout_problem(written: dict | None, cfg: DictConfig) -> tuple[str, str] | None:
    """(key, why) when a CPU run cannot resume from a checkpoint whose state.json recorded the
    layout `written`: the CPU optimizer's state belongs to the shard each rank held."""
    if not written:
        return None
    differ = [k for k in RESUME_KEYS if written[k] != cfg.parallel[k]]
    if not differ:
        return None
    saved = ", ".join(f"parallel.{k}={written[k]}" for k in RESUME_KEYS)
    return f"parallel.{differ[0]}", (
        f"the checkpoint to resume was saved under {saved}; on CPU, training resumes only "
        "under the layout it saved (its weights load under any: stages=[evaluate])"
    )


def _check_resume_layout(cfg: DictConfig) -> None:
    run = RunLayout.of(cfg.workdir)
    tracker = run.checkpoints / "latest.txt"
    if "train" not in cfg.stages or on_gpu(cfg) or run.train_done.exists():
        return
    if not tracker.is_file():
        return
    state = files.read_json_or_none(run.checkpoints / tracker.read_text().strip() / "state.json")
    problem = resume_layout_problem((state or {}).get("layout"), cfg)
    if problem:
        raise ConfigError(f"{problem[0]}: {problem[1]}")


# --- layout search ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    memory: dict[str, int]
    throughput: dict[str, float]


@dataclass
class Search:
    feasible: list[Candidate] = field(default_factory=list)  # best first
    rejected: list[str] = field(default_factory=list)  # why each other layout does not fit


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tensor_parallel_problem(cfg: DictConfig, tensor: int) -> str | None:
    m = cfg.model
    groups = m.num_query_groups or m.num_attention_heads
    if m.num_attention_heads % tensor:
        return f"TP={tensor} does not divide {m.num_attention_heads} heads"
    if groups % tensor:
        return f"TP={tensor} does not divide {groups} query groups"
    if ffn_hidden_size(m) % tensor:
        return f"TP={tensor} does not divide ffn_hidden_size {ffn_hidden_size(m)}"
    return None


def pipeline_problem(cfg: DictConfig, pipeline: int) -> str | None:
    if cfg.model.num_layers % pipeline:
        return f"PP={pipeline} does not divide {cfg.model.num_layers} layers"
    return None


def _base_layout(cfg: DictConfig) -> Layout:
    """What the search keeps from the config: precision, optimizer and overlap settings."""
    p, t = cfg.parallel, cfg.train
    return Layout(
        distributed_optimizer=p.distributed_optimizer,
        overlap_grad_reduce=p.overlap_grad_reduce,
        precision=t.precision,
        fused_kernels=True,
    )


def search_layouts(
    cfg: DictConfig,
    vocab_size: int,
    gpus: int,
    gpu_memory_gb: float,
    gpus_per_node: int = 8,
    peak: float | None = None,
    mfu: float = DEFAULT_MFU,
) -> Search:
    """Every (TP, PP, DP, micro-batch, accumulation, recompute) for `gpus` GPUs of
    `gpu_memory_gb` at the config's sequence length and global batch: those that fit, fastest
    first by `expected_step`, and a reason for each that does not. Sequence parallelism is on
    whenever TP > 1 (less memory, the same traffic)."""
    capacity = gpu_capacity_bytes(gpu_memory_gb)
    if peak is None:
        peak = peak_tflops(GPU_BY_MEMORY.get(int(gpu_memory_gb), "H100"), cfg.train.precision)
    global_batch = cfg.train.global_batch_size
    base = _base_layout(cfg)
    found = Search()
    for tensor in _divisors(gpus):
        problem = tensor_parallel_problem(cfg, tensor)
        if problem:
            found.rejected.append(problem)
            continue
        for pipeline in _divisors(gpus // tensor):
            problem = pipeline_problem(cfg, pipeline)
            if problem:
                if problem not in found.rejected:  # once, not for every TP
                    found.rejected.append(problem)
                continue
            data = gpus // (tensor * pipeline)
            where = f"TP={tensor} PP={pipeline} DP={data}"
            if global_batch % data:
                found.rejected.append(f"{where}: global batch {global_batch} not divisible by DP")
                continue
            for micro in _divisors(global_batch // data):
                for recompute in RECOMPUTE_MODES:
                    layout = replace(
                        base,
                        tensor=tensor,
                        pipeline=pipeline,
                        data=data,
                        micro_batch=micro,
                        grad_accum=global_batch // (data * micro),
                        recompute=recompute,
                        sequence_parallel=tensor > 1,
                    )
                    memory = memory_per_gpu(cfg, vocab_size, layout)
                    if memory["total"] > capacity:
                        found.rejected.append(
                            f"{where} mbs={micro} recompute={recompute}: needs "
                            f"{memory['total'] / GIB:.1f} GiB > {capacity / GIB:.1f} GiB"
                        )
                        continue
                    speed = expected_step(cfg, vocab_size, layout, gpus_per_node, peak, mfu)
                    found.feasible.append(Candidate(layout, memory, speed))
    found.feasible.sort(key=lambda c: (-c.throughput["tokens_per_s_per_gpu"], c.memory["total"]))
    return found


# --- reports ------------------------------------------------------------------------------------


def _count(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}" if n < 100 * size else f"{n / size:,.0f} {unit}"
    return f"{n:.0f}"


def _flops(n: float) -> str:
    for unit, size in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} FLOP"


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB / 10 or n == 0 else f"{n / 2**20:.1f} MiB"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def vocab_size_of(cfg: DictConfig) -> tuple[int, str]:
    """The run's vocabulary: from its data manifest when tokenized, else the tokenizer config."""
    manifests = [RunLayout.of(cfg.workdir).manifest]
    if cfg.data.prepared:
        manifests.append(RunLayout.of(cfg.data.prepared).manifest)
    for manifest in manifests:
        if manifest.exists():
            return int(json.loads(manifest.read_text())["vocab_size"]), str(manifest)
    return int(cfg.tokenizer.vocab_size), "tokenizer.vocab_size"


def measured_mfu(cfg: DictConfig) -> float | None:
    """The median MFU the run's training stage logged, if it has run on GPUs."""
    metrics = RunLayout.of(cfg.workdir).metrics
    if not metrics.exists():
        return None
    values = []
    for line in metrics.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record.get("mfu"), (int, float)):
            values.append(float(record["mfu"]))
    return statistics.median(values) if values else None


def summary_lines(cfg: DictConfig, vocab_size: int) -> list[str]:
    """A few lines for the launcher to print before it submits: parameters, FLOPs, per-GPU
    memory of the configured layout, tokens per step."""
    counts = parameter_count(cfg, vocab_size)
    layout = Layout.of(cfg)
    memory = memory_per_gpu(cfg, vocab_size, layout)
    where = "GPU" if layout.fused_kernels else "rank"
    flops = flops_per_sequence(cfg, vocab_size) / cfg.model.seq_length
    steps = cfg.train.steps
    parts = ", ".join(
        f"{key} {memory[key] / GIB:.1f}"
        for key in ("weights", "gradients", "optimizer", "activations", "logits", "overhead")
    )
    return [
        f"[plan] {cfg.model.name}: {_count(counts['total'])} parameters (embedding "
        f"{_count(counts['embedding'])}, output layer {_count(counts['output_layer'])}), "
        f"{flops / 1e9:.2f} GFLOP/token",
        f"[plan] memory per {where} ~{_gib(memory['total'])} ({parts} GiB) for {layout.describe()}",
        f"[plan] {tokens_per_step(cfg):,} tokens/step x {steps} steps = "
        f"{_count(tokens_per_step(cfg) * steps)} tokens",
    ]


@dataclass
class Options:
    """Plan-only settings, from the command line outside Hydra."""

    search: bool = False
    gpu_memory_gb: float | None = None
    gpus: int | None = None
    gpu: str | None = None
    tokens: float | None = None
    mfu: float | None = None


_FLAGS = {
    "--search": "search",
    "--gpu-memory": "gpu_memory_gb",
    "--gpus": "gpus",
    "--gpu": "gpu",
    "--tokens": "tokens",
    "--mfu": "mfu",
}
_SUFFIX = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_tokens(text: str) -> float:
    """1e9, 300M, 2B, 1.5T."""
    text = text.strip().upper()
    if text and text[-1] in _SUFFIX:
        return float(text[:-1]) * _SUFFIX[text[-1]]
    return float(text)


def _set_option(options: Options, name: str, value: str) -> None:
    if name == "search":
        options.search = value.lower() not in ("false", "0", "no")
    elif name == "gpus":
        options.gpus = int(value)
    elif name == "gpu":
        options.gpu = value
    elif name == "tokens":
        options.tokens = parse_tokens(value)
    else:
        setattr(options, name, float(value))


def pop_options(argv: list[str]) -> tuple[Options, list[str]]:
    """Take the plan's own flags (--gpu-memory 80, --gpu-memory=80, plan.gpu_memory_gb=80, ...)
    out of argv; the rest are Hydra overrides."""
    options, rest = Options(), []
    names = set(_FLAGS.values())
    i = 0
    while i < len(argv):
        arg = argv[i]
        flag, _, inline = arg.partition("=")
        if flag in _FLAGS:
            name = _FLAGS[flag]
            if name == "search" and not inline:
                value = "true"
            elif inline:
                value = inline
            else:
                if i + 1 >= len(argv):
                    raise ConfigError(f"{flag}: needs a value")
                i += 1
                value = argv[i]
            _set_option(options, name, value)
        elif flag.startswith("plan.") and flag[5:] in names and inline:
            _set_option(options, flag[5:], inline)
        else:
            rest.append(arg)
        i += 1
    return options, rest


def _parameter_lines(cfg: DictConfig, vocab_size: int, source: str, layout: Layout) -> list[str]:
    m = cfg.model
    c = parameter_count(cfg, vocab_size)
    groups = m.num_query_groups or m.num_attention_heads
    position = f" + {_count(c['position_embedding'])} positions" if c["position_embedding"] else ""
    tied = "untied" if m.untie_embeddings else "tied to the embedding"
    lines = [
        f"Model {m.name}: {m.num_layers} layers, hidden {m.hidden_size}, "
        f"{m.num_attention_heads} heads ({groups} query groups), FFN {ffn_hidden_size(m)} "
        f"{m.activation}, {m.normalization}, {m.position_embedding}; sequence {m.seq_length}",
        f"Vocabulary: {vocab_size} ({source}), padded to {c['padded_vocab']}",
        f"Parameters: {_count(c['total'])} ({c['total']:,})",
        f"  embedding     {_count(c['embedding']):>9}  ({c['padded_vocab']} x {m.hidden_size}"
        f"{position})",
        f"  transformer   {_count(c['transformer']):>9}  ({m.num_layers} x {_count(c['layer'])}: "
        f"attention {_count(c['attention_per_layer'])}, MLP {_count(c['mlp_per_layer'])}, norms "
        f"{_count(c['norms_per_layer'])}; final norm {_count(c['final_norm'])})",
        f"  output layer  {_count(c['output_layer']):>9}  ({tied})",
    ]
    t, p = layout.tensor, layout.pipeline
    stages = sorted({0, p - 1})
    per_gpu = ", ".join(
        f"stage {s}: {_count(stage_params(cfg, vocab_size, t, p, s)['total'])}" for s in stages
    )
    lines.append(f"  per GPU (TP={t}, PP={p}): {per_gpu}")
    return lines


def _memory_lines(
    cfg: DictConfig, vocab_size: int, layout: Layout, capacity: int | None
) -> list[str]:
    memory = memory_per_gpu(cfg, vocab_size, layout)
    other = memory_per_gpu(
        cfg, vocab_size, replace(layout, distributed_optimizer=not layout.distributed_optimizer)
    )
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
            f"{master}; distributed over DP={layout.data}: {_gib(with_opt['optimizer'])}, "
            f"not distributed: {_gib(without['optimizer'])}",
        ),
        (
            "activations",
            memory["activations"],
            f"{in_flight:g} micro-batch{'' if in_flight == 1 else 'es'} in flight x "
            f"{_gib(memory['activations_per_micro_batch'])}",
        ),
        ("logits", memory["logits"], "final norm and logits, last stage"),
        ("recompute", memory["working"], "one layer recomputed in backward"),
        ("overhead", memory["overhead"], "CUDA context, workspaces, allocator slack"),
    ]
    lines = [f"Memory per {where} (pipeline stage {memory['stage']}, the largest):"]
    lines += [f"  {name:<12} {_gib(value):>10}  {note}" for name, value, note in rows]
    against = ""
    if capacity is not None:
        fits = "fits" if memory["total"] <= capacity else "DOES NOT FIT"
        against = f"of {_gib(capacity)}: {fits} "
    lines.append(
        f"  {'total':<12} {_gib(memory['total']):>10}  {against}(with distributed optimizer "
        f"{_gib(with_opt['total'])}, without {_gib(without['total'])})"
    )
    return lines


def _activation_table(cfg: DictConfig, layout: Layout) -> list[str]:
    columns = [("bf16", False), ("fp8", False)]
    if layout.tensor > 1:
        columns += [("bf16", True), ("fp8", True)]
    if not layout.fused_kernels:
        columns = [(layout.precision, False)]
    layers = cfg.model.num_layers // layout.pipeline
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
        cells = "".join(f"{_gib(stage_activations(cfg, v)):>12}" for v in variants)
        lines.append(f"  {mode:<10}{cells}")
    return lines


def _time_lines(
    cfg: DictConfig, vocab_size: int, layout: Layout, options: Options, gpu: str | None
) -> list[str]:
    per_step = tokens_per_step(cfg)
    if options.tokens:
        budget, source = options.tokens, "--tokens"
    else:
        budget, source = per_step * cfg.train.steps, f"train.steps={cfg.train.steps}"
    steps = steps_for(budget, cfg)
    lines = [
        f"Tokens per step: {cfg.train.global_batch_size} x {cfg.model.seq_length} = {per_step:,}",
        f"Token budget: {_count(budget)} ({source}) = {steps:,} steps",
    ]
    peak = peak_tflops(gpu, cfg.train.precision) if gpu else None
    if peak is None:
        why = f"no peak FLOP/s known for {gpu}" if gpu else "no GPU in this config"
        lines.append(f"Wall time: {why}; name a GPU with --gpu H100 for an estimate")
        return lines
    mfu, how = options.mfu, "given"
    if mfu is None:
        mfu, how = measured_mfu(cfg), "measured"
    if mfu is None:
        mfu, how = DEFAULT_MFU, "assumed"
    seconds = wall_seconds(cfg, vocab_size, steps, layout.gpus, peak, mfu)
    lines.append(
        f"Wall time: {_duration(seconds)} on {layout.gpus} x {gpu} ({peak:g} TFLOP/s) at MFU "
        f"{mfu:.2f} ({how}); {seconds / steps:.2f} s/step"
    )
    return lines


def _search_lines(
    cfg: DictConfig, vocab_size: int, gpus: int, memory_gb: float, per_node: int, options: Options
) -> list[str]:
    gpu = options.gpu or GPU_BY_MEMORY.get(int(memory_gb), "H100")
    peak = peak_tflops(gpu, cfg.train.precision) or 989.0
    mfu = options.mfu or DEFAULT_MFU
    found = search_layouts(cfg, vocab_size, gpus, memory_gb, per_node, peak, mfu)
    capacity = gpu_capacity_bytes(memory_gb)
    lines = [
        "",
        f"Layout search: {cfg.model.name} on {gpus} x {memory_gb:g} GB ({_gib(capacity)}), "
        f"{per_node} per node, sequence {cfg.model.seq_length}, global batch "
        f"{cfg.train.global_batch_size}; ranked by expected tokens/s ({gpu}, MFU {mfu:.2f} "
        "at large micro-batches)",
        f"  {'#':>3} {'TP':>3} {'PP':>3} {'DP':>4} {'mbs':>4} {'accum':>5} {'recompute':<10}"
        f"{'SP':<4}{'memory':>11} {'MFU':>6} {'tok/s/GPU':>10} {'step':>9}",
    ]
    for i, c in enumerate(found.feasible[:15], 1):
        lo, th = c.layout, c.throughput
        lines.append(
            f"  {i:>3} {lo.tensor:>3} {lo.pipeline:>3} {lo.data:>4} {lo.micro_batch:>4} "
            f"{lo.grad_accum:>5} {lo.recompute:<10}{'yes' if lo.sequence_parallel else '-':<4}"
            f"{_gib(c.memory['total']):>11} {th['mfu']:>6.2f} "
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


def report(cfg: DictConfig, options: Options) -> list[str]:
    """The whole plan for a validated config, as lines to print."""
    vocab_size, source = vocab_size_of(cfg)
    layout = Layout.of(cfg)
    # a CPU run is compared with a GPU only when one is named
    named = options.gpu is not None or options.gpu_memory_gb is not None
    memory_gb = options.gpu_memory_gb
    if memory_gb is None:
        memory_gb = {"H200": 141.0}.get(options.gpu or "", 80.0)
    gpu = options.gpu or GPU_BY_MEMORY.get(int(memory_gb))
    if not (layout.fused_kernels or named):
        gpu = None
    capacity = gpu_capacity_bytes(memory_gb) if layout.fused_kernels or named else None
    flops = flops_per_sequence(cfg, vocab_size)
    lines = _parameter_lines(cfg, vocab_size, source, layout)
    lines.append(
        f"FLOPs per token: {_flops(flops / cfg.model.seq_length)} ({_flops(flops)} per "
        "sequence; Megatron-LM's formula)"
    )
    gpus = f"{layout.gpus} GPU{'' if layout.gpus == 1 else 's'}"
    lines.append(f"Layout: {gpus}, {layout.describe()}")
    lines += _memory_lines(cfg, vocab_size, layout, capacity)
    lines += _activation_table(cfg, layout)
    lines += _time_lines(cfg, vocab_size, layout, options, gpu)
    if options.search:
        gpus = options.gpus or world_size(cfg)
        per_node = max(1, min(cfg.cluster.gpus_per_node or 8, gpus))
        lines += _search_lines(cfg, vocab_size, gpus, memory_gb, per_node, options)
    return lines


def main_with(argv: list[str]) -> None:
    import hydra

    options, rest = pop_options(argv[1:])
    config_schema.register()

    @hydra.main(config_path="../conf", config_name="config", version_base=None)
    def main(cfg: DictConfig) -> None:
        try:
            config_schema.validate(cfg)
            print("\n".join(report(cfg, options)))
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)

    sys.argv = [argv[0], *rest]
    main()


if __name__ == "__main__":
    try:
        main_with(sys.argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
