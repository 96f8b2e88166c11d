"""The allowed values of the config keys that take one of a few (each a schema field's type)."""

from __future__ import annotations

from pipeline.config.keys import Choice

# the value that leaves a key to the planner: train.micro_batch_size, parallel.tensor and
# parallel.pipeline (train.recompute has its own member, Recompute.auto)
AUTO = "auto"


class DataFormat(Choice):
    auto = "auto"  # JSONL records or Parquet/Arrow rows, told apart by content
    text = "text"  # each file one document


class Dedup(Choice):
    none = "none"
    exact = "exact"  # documents of the same text kept once in the whole corpus


class TokenizerType(Choice):
    bpe = "bpe"
    unigram = "unigram"


class Activation(Choice):
    swiglu = "swiglu"
    gelu = "gelu"
    squared_relu = "squared_relu"  # relu(x)^2 (Primer; Nemotron-4), megatron-core's squared_relu


class Normalization(Choice):
    RMSNorm = "RMSNorm"
    LayerNorm = "LayerNorm"


class PositionEmbedding(Choice):
    rope = "rope"
    learned_absolute = "learned_absolute"


class Router(Choice):
    """How a mixture-of-experts router keeps its experts evenly loaded."""

    aux_loss = "aux_loss"  # the Switch/GShard load-balancing loss over the micro-batch
    seq_aux_loss = "seq_aux_loss"  # the same loss per sequence (DeepSeek-V2/V3)
    aux_loss_free = "aux_loss_free"  # no loss: a per-expert bias nudged each step (DeepSeek-V3)


class LrDecayStyle(Choice):
    cosine = "cosine"
    linear = "linear"
    constant = "constant"
    WSD = "WSD"


class Precision(Choice):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"


class Fp8Recipe(Choice):
    delayed = "delayed"
    tensorwise = "tensorwise"


class Recompute(Choice):
    none = "none"
    selective = "selective"
    full = "full"
    auto = "auto"  # chosen by the planner with the micro-batch


# What the planner weighs for train.recompute=auto, cheapest in compute first
RECOMPUTE_MODES = tuple(mode.value for mode in Recompute if mode is not Recompute.auto)


class Device(Choice):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class NonFinite(Choice):
    skip = "skip"
    stop = "stop"


class ExportDtype(Choice):
    bf16 = "bf16"
    fp32 = "fp32"
    fp16 = "fp16"


class ClusterName(Choice):
    local = "local"
    slurm = "slurm"


class Executor(Choice):
    inprocess = "inprocess"  # cluster=local
    subprocess = "subprocess"  # cluster=local
    slurm = "slurm"  # cluster=slurm


class WandbMode(Choice):
    disabled = "disabled"
    offline = "offline"  # files in the run folder, uploaded later with `wandb sync`
    online = "online"
