"""Config schema and every cross-field check, run before anything is submitted.

The dataclasses are registered in Hydra's ConfigStore as `base_config`, so a typo or a wrong
type in any YAML file or override fails at composition, naming the key. `validate` then checks
what a schema cannot express (batch arithmetic, divisibility, paths) and fills derived values.
"""

from __future__ import annotations

import glob
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

STAGES = ("tokenize", "train", "evaluate")


class ConfigError(ValueError):
    """A user mistake in the configuration; the message names the key."""


@dataclass
class DataConfig:
    # JSONL / JSONL.gz globs; empty: the built-in corpus
    inputs: list[str] = field(default_factory=list)
    prepared: str | None = None  # a run folder whose tokenize stage is complete: reuse its data
    text_key: str = "text"
    num_shards: int = 4
    merge_into: int | None = None  # after tokenizing, concatenate the shards into this many files
    split: str = "90,5,5"  # train, validation, test: documents, by weight
    strict: bool = False  # stop at the first bad record instead of counting it
    max_document_bytes: int = 64 * 1024 * 1024
    builtin_corpus_bytes: int = 4_000_000


@dataclass
class TokenizerConfig:
    model: str | None = None  # an existing sentencepiece .model; None: train one
    type: str = "bpe"  # bpe | unigram
    vocab_size: int = 4096
    sample_documents: int = 200_000  # seeded random sample of the corpus used for training
    max_sentence_length: int = 16384
    character_coverage: float = 0.9995
    byte_fallback: bool = True
    lossless: bool = True  # identity normalization, whitespace kept: decode(encode(x)) == x
    user_defined_symbols: list[str] = field(default_factory=lambda: ["\n"])
    seed: int = 1234
    threads: int = 2


@dataclass
class ModelConfig:
    name: str = MISSING
    num_layers: int = MISSING
    hidden_size: int = MISSING
    num_attention_heads: int = MISSING
    num_query_groups: int | None = None  # None: plain multi-head attention
    ffn_hidden_size: int | None = None  # None: 4 x hidden (or 8/3 x hidden for SwiGLU)
    seq_length: int = 2048
    max_position_embeddings: int | None = None  # None: seq_length
    activation: str = "swiglu"  # swiglu | gelu
    normalization: str = "RMSNorm"  # RMSNorm | LayerNorm
    position_embedding: str = "rope"  # rope | learned_absolute
    rotary_base: int = 10000
    untie_embeddings: bool = True
    add_bias_linear: bool = False
    init_method_std: float = 0.02
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    make_vocab_size_divisible_by: int = 128


@dataclass
class ParallelConfig:
    tensor: int = 1
    pipeline: int = 1
    virtual_pipeline: int | None = None
    sequence_parallel: bool = False
    distributed_optimizer: bool = True
    overlap_grad_reduce: bool = False


@dataclass
class TrainConfig:
    micro_batch_size: int = 8
    global_batch_size: int = 32
    grad_accum: int | None = None  # derived from the batch sizes and data-parallel size
    # Sweeps: keep global_batch_size and derive micro_batch_size from a given grad_accum.
    hold_global_batch: bool = False
    steps: int = 1000
    lr: float = 3e-4
    min_lr: float = 3e-5
    warmup_steps: int = 100
    lr_decay_style: str = "cosine"
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    precision: str = "bf16"  # fp32 | bf16 | fp16 | fp8
    fp8_recipe: str = "delayed"  # delayed | tensorwise
    recompute: str = "none"  # none | selective | full
    recompute_layers: int | None = None  # with full recompute: layers recomputed per stage
    device: str = "auto"  # auto | cpu | cuda
    # Initialise whole weights on the CPU, then shard them: the same initial model under any
    # tensor-parallel layout (slower to start for large models).
    init_on_cpu: bool = False
    # GPU kernels (Transformer Engine), ignored on CPU (docs/benchmarks.md has the figures):
    # weight gradients accumulated into the fp32 main gradients inside TE's GEMMs (no apex
    # needed for TE layers): +1% tokens/s on gpt-1.3b, the same loss curve.
    wgrad_fusion: bool = True
    # TE's own SwiGLU/GeLU instead of megatron-core's fused bias-activation: +0.6% on gpt-1.3b,
    # the same loss curve
    te_activation: bool = True
    seed: int = 1234
    log_interval: int = 10
    # [first, last]: profile these steps (1-based) with torch.profiler into train/profile.txt
    profile_steps: list[int] = field(default_factory=list)
    eval_interval: int = 100
    eval_iters: int = 10  # validation micro-batches per data-parallel rank, the same each time
    save_interval: int = 200  # 0: no checkpoints (benchmarks)
    keep_last: int = 2  # checkpoints kept besides the best one
    threads: int | None = None  # CPU threads per rank; None: torch's default
    exit_signal_lead_s: int = 120  # Slurm sends SIGUSR1 this long before the time limit
    max_requeues: int = 20
    nonfinite: str = "skip"  # skip | stop: a step whose loss or gradient is NaN or infinite


@dataclass
class EvalConfig:
    checkpoint: str = "best"  # best | latest | a checkpoint folder
    max_batches: int | None = None  # micro-batches per evaluated set; None: all of it
    micro_batch_size: int | None = None  # None: train.micro_batch_size
    prompts: list[str] = field(
        default_factory=lambda: ["The function returns", "Python is", "To open a file,"]
    )
    max_new_tokens: int = 48
    top_k: int = 40
    top_p: float = 0.9
    # More held-out sets: name -> JSONL glob or path, tokenized with the run's tokenizer
    extra_sets: dict[str, str] = field(default_factory=dict)
    all_checkpoints: bool = False  # also the test loss of every checkpoint retention kept
    # lm-evaluation-harness tasks, run only if lm_eval is installed and their data is local
    harness_tasks: list[str] = field(default_factory=list)


@dataclass
class ClusterConfig:
    name: str = "local"
    executor: str = "inprocess"  # local: inprocess | subprocess; slurm: slurm
    nodes: int = 1
    gpus_per_node: int = 0
    tasks_per_node: int | None = None  # training ranks per node; None: one per GPU (1 on CPU)
    cpus_per_task: int = 2
    mem_gb: int | None = None
    partition: str | None = None
    cpu_partition: str | None = None  # for tokenizer, tokenize and verify jobs; None: partition
    account: str | None = None
    qos: str | None = None
    time_limit: str = "04:00:00"
    cpu_time_limit: str = "02:00:00"
    array_parallelism: int = 64
    setup: list[str] = field(default_factory=list)
    sbatch_extra: dict[str, Any] = field(default_factory=dict)
    gpu: str | None = None  # GPU model, e.g. H100: peak FLOP/s, memory and fp8 support
    gpu_memory_gb: float | None = None  # None: that of cluster.gpu, when known
    checkpoint_write_gbps: float = 1.0  # write bandwidth of the checkpoint filesystem, GB/s


@dataclass
class PipelineConfig:
    workdir: str = MISSING
    stages: list[str] = field(default_factory=lambda: list(STAGES))
    dry_run: bool = False
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)


def register() -> None:
    ConfigStore.instance().store(name="base_config", node=PipelineConfig)


CONF = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")


def compose(workdir: str, *overrides: str, check: bool = True) -> DictConfig:
    """The config the command line would compose from conf/ for these overrides (validated
    unless `check` is false), for tools and tests that need one without running a stage."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register()
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = hydra_compose("config", overrides=[f"workdir={workdir}", *overrides])
    return validate(cfg) if check else cfg


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def _one_of(cfg: DictConfig, key: str, allowed: tuple[str, ...]) -> None:
    value = OmegaConf.select(cfg, key)
    _require(value in allowed, key, f"{value!r} is not one of {', '.join(allowed)}")


def slurm_minutes(limit: str, key: str) -> int:
    """Slurm's [days-]hours:minutes:seconds, hours:minutes:seconds or minutes, as whole
    minutes (seconds round up)."""
    days, _, rest = str(limit).rpartition("-")
    try:
        parts = [int(p) for p in rest.split(":")]
        day_count = int(days or 0)
    except ValueError:
        raise ConfigError(f"{key}: {limit!r} is not a Slurm time ([days-]hh:mm:ss)") from None
    if len(parts) > 3 or min(parts + [day_count]) < 0:
        raise ConfigError(f"{key}: {limit!r} is not a Slurm time ([days-]hh:mm:ss)")
    if len(parts) == 1:
        return day_count * 1440 + parts[0]
    hours, minutes, seconds = ([0] * (3 - len(parts))) + parts
    return day_count * 1440 + hours * 60 + minutes + (1 if seconds else 0)


def tasks_per_node(cfg: DictConfig) -> int:
    return cfg.cluster.tasks_per_node or cfg.cluster.gpus_per_node or 1


def world_size(cfg: DictConfig) -> int:
    """Ranks of the training job: nodes x tasks per node (one task per GPU)."""
    return cfg.cluster.nodes * tasks_per_node(cfg)


def data_parallel_size(cfg: DictConfig) -> int:
    return world_size(cfg) // (cfg.parallel.tensor * cfg.parallel.pipeline)


def validate(cfg: DictConfig) -> DictConfig:
    """Check the composed config and fill derived values (train.grad_accum). Raises ConfigError."""
    _require(bool(cfg.workdir), "workdir", "must be a path")
    _validate_script_values(cfg)
    _validate_bounds(cfg)
    for stage in cfg.stages:
        _require(stage in STAGES, "stages", f"{stage!r} is not one of {', '.join(STAGES)}")
    _require(
        list(cfg.stages) == [s for s in STAGES if s in cfg.stages],
        "stages",
        f"must be in pipeline order ({', '.join(STAGES)})",
    )
    _validate_data(cfg)
    _validate_tokenizer(cfg)
    _validate_model(cfg)
    _validate_parallel_and_batch(cfg)
    _one_of(cfg, "train.precision", ("fp32", "bf16", "fp16", "fp8"))
    _one_of(cfg, "train.fp8_recipe", ("delayed", "tensorwise"))
    _one_of(cfg, "train.recompute", ("none", "selective", "full"))
    _one_of(cfg, "train.device", ("auto", "cpu", "cuda"))
    _one_of(cfg, "train.lr_decay_style", ("cosine", "linear", "constant", "WSD"))
    t = cfg.train
    _require(t.steps > 0, "train.steps", "must be positive")
    _require(0 <= t.warmup_steps < t.steps, "train.warmup_steps", "must be in [0, train.steps)")
    _require(0 <= t.min_lr <= t.lr, "train.min_lr", "must be in [0, train.lr]")
    for key in ("log_interval", "eval_interval", "eval_iters"):
        _require(t[key] > 0, f"train.{key}", "must be positive")
    _require(t.save_interval >= 0, "train.save_interval", "must be >= 0 (0: no checkpoints)")
    _require(t.keep_last >= 1, "train.keep_last", "must be at least 1")
    ps = list(t.profile_steps)
    _require(
        not ps or (len(ps) == 2 and 1 <= ps[0] <= ps[1] <= t.steps),
        "train.profile_steps",
        f"{ps} is not [first, last] with 1 <= first <= last <= train.steps",
    )
    _one_of(cfg, "cluster.name", ("local", "slurm"))
    gpus, tasks = cfg.cluster.gpus_per_node, cfg.cluster.tasks_per_node
    _require(
        not gpus or not tasks or tasks == gpus,
        "cluster.tasks_per_node",
        f"{tasks} != cluster.gpus_per_node={gpus} (one task per GPU)",
    )
    allowed = ("inprocess", "subprocess") if cfg.cluster.name == "local" else ("slurm",)
    _one_of(cfg, "cluster.executor", allowed)
    for key in ("time_limit", "cpu_time_limit"):
        _require(slurm_minutes(cfg.cluster[key], f"cluster.{key}") > 0, f"cluster.{key}", "is 0")
    _require(cfg.cluster.checkpoint_write_gbps > 0, "cluster.checkpoint_write_gbps", "must be > 0")
    _validate_eval(cfg)
    return cfg


def _validate_eval(cfg: DictConfig) -> None:
    e = cfg.eval
    ckpt = str(e.checkpoint)
    _require(
        ckpt in ("best", "latest") or os.path.isdir(ckpt) or "train" in cfg.stages,
        "eval.checkpoint",
        f"{ckpt!r} is neither best, latest nor a checkpoint folder",
    )
    _require(e.max_batches is None or e.max_batches > 0, "eval.max_batches", "must be positive")
    if "evaluate" not in cfg.stages:
        return
    for name, pattern in e.extra_sets.items():
        key = f"eval.extra_sets.{name}"
        _require(re.fullmatch(r"[\w.-]+", name) is not None, key, "name a set with [A-Za-z0-9_.-]")
        _require(name != "test", key, "'test' is the held-out split's own name")
        matches = [p for p in glob.glob(os.path.expanduser(str(pattern))) if os.path.isfile(p)]
        _require(bool(matches), key, f"{pattern!r} matches no file")
        for path in matches:
            _require(os.access(path, os.R_OK), key, f"{path} is not readable")


def _validate_data(cfg: DictConfig) -> None:
    d = cfg.data
    _require(d.num_shards >= 1, "data.num_shards", "must be at least 1")
    _require(bool(d.text_key), "data.text_key", "must not be empty")
    if d.prepared:
        manifest = os.path.join(os.path.expanduser(d.prepared), "data", "manifest.json")
        _require(os.path.isfile(manifest), "data.prepared", f"{manifest} does not exist")
        _require("tokenize" not in cfg.stages, "stages", "drop tokenize when data.prepared is set")
    if "tokenize" in cfg.stages:
        for pattern in d.inputs:
            matches = glob.glob(os.path.expanduser(pattern))
            _require(bool(matches), "data.inputs", f"{pattern!r} matches no file")
            for path in matches:
                _require(os.access(path, os.R_OK), "data.inputs", f"{path} is not readable")
    try:
        weights = [float(x) for x in d.split.split(",")]
    except ValueError:
        raise ConfigError(f"data.split: {d.split!r} is not three comma-separated numbers") from None
    _require(len(weights) == 3 and min(weights) >= 0, "data.split", "needs 3 weights >= 0")
    _require(weights[0] > 0, "data.split", "the training weight must be positive")
    _require(weights[2] > 0 or "evaluate" not in cfg.stages, "data.split", "needs a test share")


def _validate_tokenizer(cfg: DictConfig) -> None:
    tk = cfg.tokenizer
    if tk.model:
        _require(os.path.isfile(tk.model), "tokenizer.model", f"{tk.model} is not a file")
    _one_of(cfg, "tokenizer.type", ("bpe", "unigram"))
    _require(tk.vocab_size >= 64, "tokenizer.vocab_size", "must be at least 64")
    _require(0 < tk.character_coverage <= 1, "tokenizer.character_coverage", "must be in (0, 1]")


def _validate_model(cfg: DictConfig) -> None:
    m = cfg.model
    for key in ("num_layers", "hidden_size", "num_attention_heads", "seq_length"):
        _require(m[key] > 0, f"model.{key}", "must be positive")
    _require(
        m.hidden_size % m.num_attention_heads == 0,
        "model.hidden_size",
        f"{m.hidden_size} is not divisible by model.num_attention_heads={m.num_attention_heads}",
    )
    groups = m.num_query_groups or m.num_attention_heads
    _require(
        m.num_attention_heads % groups == 0,
        "model.num_query_groups",
        f"{groups} does not divide model.num_attention_heads={m.num_attention_heads}",
    )
    _one_of(cfg, "model.activation", ("swiglu", "gelu"))
    _one_of(cfg, "model.normalization", ("RMSNorm", "LayerNorm"))
    _one_of(cfg, "model.position_embedding", ("rope", "learned_absolute"))
    _require(
        m.make_vocab_size_divisible_by >= 1,
        "model.make_vocab_size_divisible_by",
        "must be at least 1 (the vocabulary is padded to a multiple of it x parallel.tensor)",
    )
    limit = m.max_position_embeddings or m.seq_length
    _require(
        m.seq_length <= limit,
        "model.seq_length",
        f"{m.seq_length} exceeds model.max_position_embeddings={limit}",
    )


def _validate_parallel_and_batch(cfg: DictConfig) -> None:
    p, t, m = cfg.parallel, cfg.train, cfg.model
    _require(p.tensor >= 1 and p.pipeline >= 1, "parallel", "tensor and pipeline must be >= 1")
    ws = world_size(cfg)
    _require(
        ws % (p.tensor * p.pipeline) == 0,
        "parallel.tensor",
        f"tensor x pipeline = {p.tensor * p.pipeline} does not divide the world size {ws} "
        f"(cluster.nodes x cluster.gpus_per_node)",
    )
    groups = m.num_query_groups or m.num_attention_heads
    _require(
        m.num_attention_heads % p.tensor == 0 and groups % p.tensor == 0,
        "parallel.tensor",
        f"{p.tensor} does not divide the attention heads ({m.num_attention_heads}) "
        f"and query groups ({groups})",
    )
    stages = p.pipeline * (p.virtual_pipeline or 1)
    _require(
        m.num_layers % stages == 0,
        "parallel.pipeline",
        f"model.num_layers={m.num_layers} is not divisible by pipeline x virtual stages = {stages}",
    )
    _require(
        not p.sequence_parallel or p.tensor > 1,
        "parallel.sequence_parallel",
        "needs parallel.tensor > 1",
    )
    dp = data_parallel_size(cfg)
    if t.hold_global_batch and t.grad_accum is not None:
        _require(
            t.global_batch_size % (t.grad_accum * dp) == 0,
            "train.grad_accum",
            f"{t.grad_accum} x data-parallel size {dp} does not divide "
            f"train.global_batch_size={t.global_batch_size}",
        )
        t.micro_batch_size = t.global_batch_size // (t.grad_accum * dp)
    _require(t.micro_batch_size >= 1, "train.micro_batch_size", "must be at least 1")
    per_step = t.micro_batch_size * dp
    if t.grad_accum is None:
        _require(
            t.global_batch_size % per_step == 0,
            "train.global_batch_size",
            f"{t.global_batch_size} is not a multiple of train.micro_batch_size x data-parallel "
            f"size = {t.micro_batch_size} x {dp}",
        )
        t.grad_accum = t.global_batch_size // per_step
    else:
        _require(
            t.global_batch_size == per_step * t.grad_accum,
            "train.global_batch_size",
            f"{t.global_batch_size} != train.micro_batch_size x data-parallel size x "
            f"train.grad_accum = {t.micro_batch_size} x {dp} x {t.grad_accum}",
        )


# Values that must be at least 1 (None, where a key allows it, means "derive it").
_AT_LEAST_ONE = (
    "data.max_document_bytes",
    "data.builtin_corpus_bytes",
    "data.merge_into",
    "tokenizer.sample_documents",
    "tokenizer.max_sentence_length",
    "tokenizer.threads",
    "model.ffn_hidden_size",
    "model.make_vocab_size_divisible_by",
    "parallel.virtual_pipeline",
    "train.grad_accum",
    "train.threads",
    "eval.max_batches",
    "eval.micro_batch_size",
    "cluster.nodes",
    "cluster.tasks_per_node",
    "cluster.cpus_per_task",
    "cluster.mem_gb",
    "cluster.array_parallelism",
)
_NOT_NEGATIVE = (
    "train.clip_grad",
    "train.weight_decay",
    "train.max_requeues",
    "eval.max_new_tokens",
    "eval.top_k",
    "cluster.gpus_per_node",
)
_POSITIVE = ("train.lr", "train.adam_eps", "model.init_method_std", "model.rotary_base")
_FRACTION = (
    "train.adam_beta1",
    "train.adam_beta2",
    "model.hidden_dropout",
    "model.attention_dropout",
)


def _validate_bounds(cfg: DictConfig) -> None:
    """Numbers the schema types accept but the stages cannot use (a zero that would divide,
    a negative size, a rate out of range): refused here rather than failing inside a job."""
    _one_of(cfg, "train.nonfinite", ("skip", "stop"))
    for key in _AT_LEAST_ONE:
        value = OmegaConf.select(cfg, key)
        _require(value is None or value >= 1, key, f"{value} must be at least 1")
    for key in _NOT_NEGATIVE:
        value = OmegaConf.select(cfg, key)
        _require(value >= 0, key, f"{value} must not be negative")
    for key in _POSITIVE:
        value = OmegaConf.select(cfg, key)
        _require(value > 0 and math.isfinite(value), key, f"{value} must be a positive number")
    for key in _FRACTION:
        value = OmegaConf.select(cfg, key)
        _require(0 <= value < 1, key, f"{value} must be in [0, 1)")
    top_p = cfg.eval.top_p
    _require(0 < top_p <= 1, "eval.top_p", f"{top_p} must be in (0, 1]")


# Control characters: a newline would end an #SBATCH line and start a shell command.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SBATCH_OPTION = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_NO_CONTROL = "must not contain a newline or other control character (it goes into a script)"
# The workdir is in every job's log paths and command line; the rest become #SBATCH options.
_SCRIPT_KEYS = (
    "workdir",
    "cluster.partition",
    "cluster.cpu_partition",
    "cluster.account",
    "cluster.qos",
)


def _validate_script_values(cfg: DictConfig) -> None:
    """Config values that end up in the sbatch scripts submitit writes. submitit quotes each
    value for the shell, so `x; rm -rf ~` stays one harmless word, but no quoting survives a
    newline. cluster.setup lines are shell by design: they run as written, like a site's
    module loads."""
    for key in _SCRIPT_KEYS:
        value = OmegaConf.select(cfg, key)
        _require(value is None or not _CONTROL.search(str(value)), key, _NO_CONTROL)
    for name, value in cfg.cluster.sbatch_extra.items():
        valid = bool(_SBATCH_OPTION.fullmatch(str(name)))
        _require(valid, "cluster.sbatch_extra", f"{str(name)!r} is not an sbatch option name")
        key = f"cluster.sbatch_extra.{name}"
        _require(
            isinstance(value, (str, int, float)) and value is not False,
            key,
            f"{value!r} must be a string, a number or true (a flag)",
        )
        _require(not _CONTROL.search(str(value)), key, _NO_CONTROL)
