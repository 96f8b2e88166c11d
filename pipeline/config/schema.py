"""The config schema: one dataclass per section of conf/.

Registered in Hydra's ConfigStore as `base_config` (pipeline.config.compose), so a typo or a
wrong type in any YAML file or override fails at composition, naming the key. The composed
config becomes an instance of `PipelineConfig` once, at the command line, and every step and
component receives it, or the section it needs, typed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

STAGES = ("tokenize", "train", "evaluate", "export")
DEFAULT_STAGES = STAGES[:3]  # export: added to stages when wanted
AUTO = "auto"  # train.micro_batch_size and train.recompute: the planner chooses


@dataclass
class SourceConfig:
    """One source of a data mixture (data.sources.NAME)."""

    # globs of JSONL (plain, gzip, zstd), Parquet, Arrow files or datasets.save_to_disk folders
    inputs: list[str] = field(default_factory=list)
    text_key: str | None = None  # None: data.text_key
    weight: float = 1.0  # share of the training samples drawn from it, relative to the others
    format: str | None = None  # auto | text (each file one document); None: data.format
    where: str | None = None  # Parquet/Arrow row filter ("language_score >= 0.9"); None: all


@dataclass
class DataConfig:
    # globs of a corpus of one source: JSONL (plain, gzip, zstd), Parquet, Arrow files or
    # datasets.save_to_disk folders, told apart by content; empty (and no sources): the built-in
    # one. Each data group sets it, so that one that leaves it ??? is refused, not defaulted.
    inputs: list[str] = MISSING
    # auto: JSONL records or Parquet/Arrow rows, by content; text: each file one document
    format: str = "auto"
    where: str | None = None  # a row filter on Parquet/Arrow columns of data.inputs; None: all
    # A weighted mixture instead: name -> SourceConfig (inputs, text key, sampling weight).
    # Untyped here, as OmegaConf cannot add typed entries from the command line
    # (+data.sources.NAME={inputs:[GLOB],weight:W}); pipeline.config.compose checks each.
    sources: dict[str, Any] = field(default_factory=dict)
    prepared: str | None = None  # a run folder whose tokenize stage is complete: reuse its data
    text_key: str = "text"
    num_shards: int = 4
    merge_into: int | None = None  # after tokenizing, concatenate each split's files into this many
    # train, validation, test: each document's share, decided by a seeded hash of its text
    split: str = "90,5,5"
    split_seed: int = 1234
    dedup: str = "none"  # none | exact: documents of the same text kept once in the whole corpus
    # The plan warns when the training token budget repeats a source more often than this
    warn_epochs: float = 4.0
    strict: bool = False  # stop at the first bad record instead of counting it
    # a run that would read a source more times than this is refused before it starts (the
    # plan prints each source's epochs; data.warn_epochs warns earlier)
    max_epochs: float = 1000.0
    # the share of all records that may be bad (each is counted and logged in data/rejects/)
    # before the run stops at verify, naming the reasons; a file none of whose records is a
    # document stops it whatever this says
    max_reject_fraction: float = 0.01
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
    # A local Hugging Face Llama folder (config.json, safetensors): the run starts from its
    # weights and, unless tokenizer.model is given, its tokenizer.model (continued pretraining)
    init_from: str | None = None


@dataclass
class ParallelConfig:
    # numbers, or auto (GPU runs): the planner picks them with the micro-batch
    # (pipeline.planning.auto); with tensor=auto, sequence parallelism follows its choice
    tensor: Any = 1
    pipeline: Any = 1
    virtual_pipeline: int | None = None
    sequence_parallel: bool = False
    distributed_optimizer: bool = True
    overlap_grad_reduce: bool = False


@dataclass
class TrainConfig:
    # a number, or auto (GPU runs): the planner picks the fastest micro-batch whose memory
    # estimate fits the GPU with a margin (pipeline.planning.auto), before anything runs
    micro_batch_size: Any = 8
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
    recompute: str = "none"  # none | selective | full | auto (chosen with the micro-batch)
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
    # RoPE over the unsplit QKV projection as one torch.compile'd kernel each way (split,
    # rotation and, backwards, the QKV gradient in one pass); false: Transformer Engine's RoPE
    compiled_rope: bool = True
    # NVIDIA apex where it is installed (never the PyPI package named apex): megatron-core's
    # gradient-accumulation fusion through its CUDA kernel, the output layer's included; false
    # leaves it out (TE's GEMMs still accumulate theirs), for rows with and without it
    apex: bool = True
    seed: int = 1234
    log_interval: int = 10
    # [first, last]: profile these steps (1-based) with torch.profiler into train/profile.txt
    profile_steps: list[int] = field(default_factory=list)
    eval_interval: int = 100
    # Sequences each validation reads: the same ones each time, whatever the micro-batch size
    # or number of ranks, so runs and sweep points compare
    eval_samples: int = 64
    # Before eval_samples: micro-batches per data-parallel rank. Read from run folders and jobs
    # of earlier versions; refused on a command line (it differs with the micro-batch size).
    eval_iters: int | None = None
    save_interval: int = 200  # 0: no checkpoints (benchmarks)
    keep_last: int = 2  # checkpoints kept besides the best one
    # write checkpoints in the background (megatron-core's asynchronous saving): training waits
    # only for the copy to host memory, which then holds one more copy of this rank's share
    async_save: bool = True
    # GPU runs with parallel.distributed_optimizer: save its state so that the run resumes
    # under any tensor/pipeline layout. It is then gathered and reshaped on the host at every
    # save, which holds training for about a minute at 1.3B; false (Megatron-LM's default) saves
    # each rank's shard in place, and a resume keeps the tensor/pipeline layout (the
    # data-parallel size may change). The weights load under any layout either way.
    reshardable_optimizer: bool = False
    threads: int | None = None  # CPU threads per rank; None: torch's default
    exit_signal_lead_s: int = 120  # Slurm warns (SIGUSR2) this long before the time limit
    max_requeues: int = 20
    nonfinite: str = "skip"  # skip | stop: a step whose loss or gradient is NaN or infinite
    # Derived, not a setting: what micro_batch_size=auto / recompute=auto became, and why
    auto_choice: str | None = None


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
class ExportConfig:
    """The export stage and `python -m pipeline.export`: the checkpoint eval.checkpoint names, as
    a Hugging Face model folder with its tokenizer."""

    out: str | None = None  # None: WORKDIR/export
    dtype: str = "bf16"  # bf16 | fp32 | fp16: the weights' dtype in the folder
    shard_gb: float = 5.0  # the most weight bytes in one safetensors file


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
    # exported in every job script before its tasks start (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, ...)
    env: dict[str, str] = field(default_factory=dict)
    srun_args: list[str] = field(default_factory=list)  # more options for the tasks' srun
    # a container for the tasks (pyxis/enroot: srun --container-image, --container-mounts)
    container_image: str | None = None
    container_mounts: list[str] = field(default_factory=list)  # SRC:DST[:FLAGS]
    gpu: str | None = None  # GPU model, e.g. H100: peak FLOP/s, memory and fp8 support
    gpu_memory_gb: float | None = None  # None: that of cluster.gpu, when known
    checkpoint_write_gbps: float = 1.0  # write bandwidth of the checkpoint filesystem, GB/s
    # how long a rank waits for every rank to reach the first node before the job fails
    rendezvous_timeout_s: float = 300.0


@dataclass
class PipelineConfig:
    workdir: str = MISSING
    stages: list[str] = field(default_factory=lambda: list(DEFAULT_STAGES))
    dry_run: bool = False
    # redo this step and every step after it, though its outputs exist (made with other
    # settings, say); what they held is moved to replaced/ in the run folder
    force: str | None = None
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
