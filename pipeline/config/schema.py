"""The config schema: one dataclass per section of conf/, each leaf key declared once with its
whole story (pipeline.config.keys):

    name: type = key(default, ROLE, "help line", rule=..., command=..., script=..., common=...)

- ROLE, required: OUTPUT (what an output is made from: changed, it is redone or refused),
  CONTINUE (changed, a training goes on), NOT_SETTING (how, where or how fast: changed, every
  output stays valid). Provenance records the OUTPUT and CONTINUE keys of a section.
- choices: the field's type is a Choice enum (pipeline.config.choices);
- rule=AT_LEAST_ONE, POSITIVE, A_FILE, ... (pipeline.config.rules): what a value must be beyond
  its type, checked by pipeline.config.checks and shown by --help;
- command=True (or `command(...)`): what to run, where and how; each command line's own, never
  replayed from the run's history; script=True: the value is written into job scripts;
- common=True: listed by --help with its help line.

A new key needs nothing more than its field here, the code that reads it, and its test.
Registered in Hydra's ConfigStore as `base_config` (pipeline.config.compose), so a typo or a
wrong type in any YAML file or override fails at composition, naming the key. The composed
config becomes an instance of `PipelineConfig` once, at the command line, and every step and
component receives it, or the section it needs, typed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from pipeline.config import choices as c
from pipeline.config import rules as r
from pipeline.config.keys import Role, command, key
from pipeline.config.rules import AT_LEAST_ONE, FRACTION, NOT_EMPTY, NOT_NEGATIVE, POSITIVE

STAGES = ("tokenize", "train", "evaluate", "export")
DEFAULT_STAGES = STAGES[:3]  # export: added to stages when wanted
AUTO = "auto"  # train.micro_batch_size and train.recompute: the planner chooses
# The sections the run that holds the data settles (data.prepared): a run that trains on
# another's data takes these from that run's history
DATA_SECTIONS = ("data", "tokenizer")

OUTPUT, CONTINUE, NOT_SETTING = Role.OUTPUT, Role.CONTINUE, Role.NOT_SETTING


@dataclass
class SourceConfig:
    """One source of a data mixture (data.sources.NAME)."""

    # globs of JSONL (plain, gzip, zstd), Parquet, Arrow files or datasets.save_to_disk folders
    inputs: list[str] = key(role=OUTPUT, help="globs of its files", factory=list)
    text_key: str | None = key(None, OUTPUT, "none: data.text_key", rule=NOT_EMPTY)
    weight: float = key(
        1.0, OUTPUT, "its share of the training samples, relative to the others", rule=POSITIVE
    )
    format: str | None = key(
        None, OUTPUT, "auto | text (a file a document); none: data.format", rule=r.SOURCE_FORMAT
    )
    where: str | None = key(
        None, OUTPUT, "a Parquet/Arrow row filter; none: all", rule=r.ROW_FILTER
    )


@dataclass
class DataConfig:
    # Each data group sets it, so that one that leaves it ??? is refused, not defaulted
    inputs: list[str] = key(
        MISSING,
        OUTPUT,
        "globs of one source (JSONL plain/gzip/zstd, Parquet, Arrow, datasets folders, text); "
        "empty: the built-in corpus",
        common=True,
    )
    format: c.DataFormat = key(
        c.DataFormat.auto, OUTPUT, "auto: records or rows, by content; text: a file a document"
    )
    where: str | None = key(
        None,
        OUTPUT,
        "a row filter on Parquet/Arrow columns, e.g. 'language_score >= 0.9'",
        rule=r.ROW_FILTER,
    )
    # Untyped, as OmegaConf cannot add typed entries from the command line
    # (+data.sources.NAME={inputs:[GLOB],weight:W}); pipeline.config.compose checks each
    sources: dict[str, Any] = key(
        role=OUTPUT,
        help="a weighted mixture: NAME={inputs: [GLOB], weight: W}",
        factory=dict,
        rule=r.SOURCE_NAMES,
        common=True,
    )
    prepared: str | None = key(
        None,
        NOT_SETTING,
        "train on the tokenized data of this run folder",
        rule=r.PREPARED_RUN,
        common=True,
    )
    text_key: str = key("text", OUTPUT, "the JSON key of each record's text", rule=NOT_EMPTY)
    num_shards: int = key(4, OUTPUT, "tokenize tasks, one shard each", rule=AT_LEAST_ONE)
    merge_into: int | None = key(
        None, OUTPUT, "concatenate each split's files into this many", rule=AT_LEAST_ONE
    )
    # a pipeline.config.split_weights.Split once composed (OmegaConf types no union of str and
    # list)
    split: Any = key(
        "90,5,5", OUTPUT, "train,validation,test shares: '90,5,5' or [90,5,5]", rule=r.SPLIT
    )
    split_seed: int = key(1234, OUTPUT, "the seed of the split's hash")
    dedup: c.Dedup = key(c.Dedup.none, OUTPUT, "exact: documents of one text kept once")
    warn_epochs: float = key(
        4.0, NOT_SETTING, "the plan warns past this many epochs of a source", rule=POSITIVE
    )
    strict: bool = key(False, NOT_SETTING, "stop at the first bad record instead of counting it")
    max_epochs: float = key(
        1000.0, NOT_SETTING, "refuse a run reading a source more often", rule=POSITIVE
    )
    # each bad record is counted and logged in data/rejects/; a file none of whose records is
    # a document stops the run whatever this says
    max_reject_fraction: float = key(
        0.01, NOT_SETTING, "the share of bad records verify accepts before it stops", rule=r.SHARE
    )
    max_document_bytes: int = key(
        64 * 1024 * 1024, OUTPUT, "longer documents are rejected", rule=AT_LEAST_ONE
    )
    builtin_corpus_bytes: int = key(
        4_000_000, OUTPUT, "the size of the built-in corpus", rule=AT_LEAST_ONE
    )


@dataclass
class TokenizerConfig:
    model: str | None = key(
        None,
        OUTPUT,
        "an existing sentencepiece .model; none: train one",
        rule=r.A_FILE,
        common=True,
    )
    type: c.TokenizerType = key(c.TokenizerType.bpe, OUTPUT, "the sentencepiece model type")
    # none in a run's config.yaml beside a given tokenizer.model, whose pieces it does not set
    vocab_size: int | None = key(
        4096, OUTPUT, "pieces of a trained tokenizer", rule=r.at_least(64), common=True
    )
    sample_documents: int = key(
        200_000, OUTPUT, "documents of a seeded sample to train on", rule=AT_LEAST_ONE
    )
    max_sentence_length: int = key(16384, OUTPUT, "sentencepiece's", rule=AT_LEAST_ONE)
    character_coverage: float = key(0.9995, OUTPUT, "sentencepiece's", rule=r.PROBABILITY)
    byte_fallback: bool = key(True, OUTPUT, "unknown characters as bytes")
    lossless: bool = key(True, OUTPUT, "identity normalization: decode(encode(x)) == x")
    user_defined_symbols: list[str] = key(
        role=OUTPUT, help="pieces kept whole", factory=lambda: ["\n"]
    )
    seed: int = key(1234, OUTPUT, "the sample's and the trainer's seed")
    threads: int = key(2, NOT_SETTING, "threads of the trainer", rule=AT_LEAST_ONE)


@dataclass
class ModelConfig:
    name: str = key(MISSING, OUTPUT, "the model's name (its config group)")
    num_layers: int = key(MISSING, OUTPUT, "transformer layers", rule=AT_LEAST_ONE, common=True)
    hidden_size: int = key(MISSING, OUTPUT, "the hidden width", rule=AT_LEAST_ONE, common=True)
    num_attention_heads: int = key(
        MISSING, OUTPUT, "attention heads", rule=AT_LEAST_ONE, common=True
    )
    num_query_groups: int | None = key(
        None, OUTPUT, "grouped-query attention; none: multi-head", rule=AT_LEAST_ONE
    )
    ffn_hidden_size: int | None = key(
        None, OUTPUT, "none: 4 x hidden (8/3 x hidden for SwiGLU)", rule=AT_LEAST_ONE
    )
    seq_length: int = key(2048, OUTPUT, "tokens per sequence", rule=AT_LEAST_ONE, common=True)
    max_position_embeddings: int | None = key(
        None, OUTPUT, "none: model.seq_length", rule=AT_LEAST_ONE
    )
    activation: c.Activation = key(c.Activation.swiglu, OUTPUT, "the MLP's activation")
    normalization: c.Normalization = key(c.Normalization.RMSNorm, OUTPUT, "the layer norm")
    position_embedding: c.PositionEmbedding = key(c.PositionEmbedding.rope, OUTPUT, "positions")
    rotary_base: int = key(10000, OUTPUT, "RoPE's base", rule=POSITIVE)
    untie_embeddings: bool = key(True, OUTPUT, "an output layer of its own")
    add_bias_linear: bool = key(False, OUTPUT, "biases in the linear layers")
    init_method_std: float = key(0.02, OUTPUT, "the initial weights' deviation", rule=POSITIVE)
    hidden_dropout: float = key(0.0, OUTPUT, "dropout after attention and MLP", rule=FRACTION)
    attention_dropout: float = key(0.0, OUTPUT, "dropout of attention", rule=FRACTION)
    make_vocab_size_divisible_by: int = key(
        128, OUTPUT, "pad the vocabulary to a multiple", rule=AT_LEAST_ONE
    )
    # unless tokenizer.model is given, its tokenizer.model too (continued pretraining)
    init_from: str | None = key(
        None,
        OUTPUT,
        "start from a local Hugging Face Llama folder's weights",
        rule=r.A_FOLDER,
        common=True,
    )


@dataclass
class ParallelConfig:
    # Any: a number or auto (OmegaConf has no unions); what runs reads them typed
    # (pipeline.config.derived.settled)
    tensor: Any = command(
        1, "tensor-parallel size, or auto (GPU runs)", rule=r.whole_or(AUTO), common=True
    )
    pipeline: Any = command(
        1, "pipeline-parallel size, or auto (GPU runs)", rule=r.whole_or(AUTO), common=True
    )
    virtual_pipeline: int | None = command(
        None, "virtual stages per pipeline rank", rule=AT_LEAST_ONE, common=True
    )
    # none: on whenever tensor parallelism is, on GPUs (less activation memory, the same traffic)
    sequence_parallel: bool | None = command(None, "none: on with parallel.tensor > 1 on GPUs")
    distributed_optimizer: bool = command(True, "optimizer state sharded over data parallelism")
    # Communication overlap, as the fastest published Megatron runs use it; each is a no-op on
    # one GPU (no data-parallel or tensor-parallel peers to talk to)
    overlap_grad_reduce: bool = command(
        True, "gradients reduce-scattered bucket by bucket during the backward pass"
    )
    overlap_param_gather: bool = command(
        True, "with the distributed optimizer: weights all-gathered during the next forward"
    )
    # off until measured on several GPUs (tools/bench_scaling.py): it needs a TE build with
    # userbuffers
    tp_comm_overlap: bool = command(
        False, "TP with sequence parallelism: TE's userbuffers overlap its collectives with GEMMs"
    )
    ddp_bucket_size: int | None = command(
        None,
        "parameters per gradient-reduction bucket; none: megatron-core's (40M or 1M x DP)",
        rule=AT_LEAST_ONE,
    )


@dataclass
class TrainConfig:
    # auto (GPU runs): the planner picks the fastest micro-batch whose memory estimate fits
    # the GPU with a margin (pipeline.planning.auto), before anything runs; settled, it is read
    # as an int from pipeline.config.derived.settled
    micro_batch_size: Any = key(
        8, NOT_SETTING, "sequences per rank and pass, or auto", rule=r.whole_or(AUTO), common=True
    )
    global_batch_size: int = key(
        32, OUTPUT, "sequences per training step", rule=AT_LEAST_ONE, common=True
    )
    grad_accum: int | None = key(
        None, NOT_SETTING, "derived from the batch sizes", rule=AT_LEAST_ONE
    )
    # Sweeps: keep global_batch_size and derive micro_batch_size from a given grad_accum
    hold_global_batch: bool = key(False, NOT_SETTING, "derive the micro-batch from grad_accum")
    steps: int = key(
        1000, CONTINUE, "training steps; more continues a run", rule=AT_LEAST_ONE, common=True
    )
    lr: float = key(3e-4, OUTPUT, "the peak learning rate", rule=POSITIVE, common=True)
    min_lr: float = key(
        3e-5, OUTPUT, "the learning rate at the end of the decay", rule=NOT_NEGATIVE
    )
    warmup_steps: int = key(100, OUTPUT, "steps of linear warm-up", rule=NOT_NEGATIVE)
    lr_decay_style: c.LrDecayStyle = key(c.LrDecayStyle.cosine, OUTPUT, "the decay's shape")
    weight_decay: float = key(0.1, OUTPUT, "AdamW's", rule=NOT_NEGATIVE)
    adam_beta1: float = key(0.9, OUTPUT, "AdamW's", rule=FRACTION)
    adam_beta2: float = key(0.95, OUTPUT, "AdamW's", rule=FRACTION)
    adam_eps: float = key(1e-8, OUTPUT, "AdamW's", rule=POSITIVE)
    clip_grad: float = key(1.0, OUTPUT, "the gradient norm's limit", rule=NOT_NEGATIVE)
    precision: c.Precision = key(c.Precision.bf16, OUTPUT, "the math's precision", common=True)
    fp8_recipe: c.Fp8Recipe = key(c.Fp8Recipe.delayed, OUTPUT, "fp8 scaling")
    recompute: c.Recompute = key(
        c.Recompute.none, NOT_SETTING, "activations recomputed in the backward pass", common=True
    )
    recompute_layers: int | None = key(None, NOT_SETTING, "full recompute: layers per stage")
    device: c.Device = command(c.Device.auto, "where training runs")
    # the same initial model under any tensor-parallel layout (slower to start large models)
    init_on_cpu: bool = key(False, OUTPUT, "initialise whole weights on the CPU, then shard")
    # GPU kernels (docs/benchmarks.md has the figures), ignored on CPU:
    wgrad_fusion: bool = key(
        True, NOT_SETTING, "weight gradients accumulated in TE's GEMMs (no apex needed)"
    )
    te_activation: bool = key(True, NOT_SETTING, "TE's SwiGLU/GeLU, not megatron-core's fused")
    # split, rotation and, backwards, the QKV gradient in one pass; false: TE's RoPE
    compiled_rope: bool = key(True, NOT_SETTING, "RoPE over the unsplit QKV, one compiled kernel")
    # never the PyPI package named apex; false leaves it out (TE's GEMMs still accumulate theirs)
    apex: bool = key(True, NOT_SETTING, "NVIDIA apex's gradient-accumulation fusion, installed")
    seed: int = key(1234, OUTPUT, "the seed of initialisation and sampling")
    log_interval: int = key(10, NOT_SETTING, "steps between log lines", rule=AT_LEAST_ONE)
    profile_steps: list[int] = key(
        role=NOT_SETTING, help="[first, last]: profiled into train/profile.txt", factory=list
    )
    eval_interval: int = key(
        100, CONTINUE, "steps between validations", rule=AT_LEAST_ONE, common=True
    )
    # the same sequences each time, whatever the micro-batch or ranks, so runs compare;
    # recorded as train.validation_samples
    eval_samples: int = key(64, OUTPUT, "sequences each validation reads", rule=AT_LEAST_ONE)
    # Read from run folders and jobs of earlier versions; refused on a command line
    eval_iters: int | None = key(None, NOT_SETTING, "before eval_samples: micro-batches per rank")
    save_interval: int = key(
        200, CONTINUE, "steps between checkpoints; 0: none", rule=NOT_NEGATIVE, common=True
    )
    keep_last: int = key(2, CONTINUE, "checkpoints kept besides the best one", rule=AT_LEAST_ONE)
    # training waits only for the copy to host memory, which holds one more copy of the shard
    async_save: bool = key(True, NOT_SETTING, "write checkpoints in the background", common=True)
    # the state is gathered and reshaped on the host at each save (a minute at 1.3B); false
    # saves each rank's shard in place, and a resume keeps the tensor/pipeline layout
    reshardable_optimizer: bool = key(
        False, NOT_SETTING, "save the distributed optimizer's state for any layout"
    )
    threads: int | None = key(
        None, NOT_SETTING, "CPU threads per rank; none: torch's", rule=AT_LEAST_ONE
    )
    nonfinite: c.NonFinite = key(c.NonFinite.skip, CONTINUE, "a NaN/inf step: skip or stop")
    # fp16's loss-scale overflows do not count
    max_skipped_in_a_row: int = key(
        10,
        CONTINUE,
        "with nonfinite=skip: this many NaN/inf steps in a row stop a diverged run",
        rule=AT_LEAST_ONE,
    )
    # Derived, not a setting
    auto_choice: str | None = key(None, NOT_SETTING, "what the planner chose for auto, and why")


@dataclass
class EvalConfig:
    checkpoint: str = key("best", OUTPUT, "best | latest | a checkpoint folder", common=True)
    max_batches: int | None = key(
        None, OUTPUT, "micro-batches per evaluated set; none: all", rule=AT_LEAST_ONE
    )
    micro_batch_size: int | None = key(
        None, OUTPUT, "none: train.micro_batch_size", rule=AT_LEAST_ONE
    )
    prompts: list[str] = key(
        role=OUTPUT,
        help="prompts of the samples generated",
        factory=lambda: ["The function returns", "Python is", "To open a file,"],
    )
    max_new_tokens: int = key(48, OUTPUT, "tokens generated per prompt", rule=NOT_NEGATIVE)
    top_k: int = key(40, OUTPUT, "sampling's", rule=NOT_NEGATIVE)
    top_p: float = key(0.9, OUTPUT, "sampling's", rule=r.PROBABILITY)
    extra_sets: dict[str, str] = key(
        role=OUTPUT,
        help="more held-out sets: NAME=JSONL glob",
        factory=dict,
        rule=r.EXTRA_SET_NAMES,
    )
    all_checkpoints: bool = key(False, OUTPUT, "the test loss of every kept checkpoint too")
    # run only if lm_eval is installed and their data is local
    harness_tasks: list[str] = key(role=OUTPUT, help="lm-evaluation-harness tasks", factory=list)


@dataclass
class ExportConfig:
    """The export stage and `python -m pipeline.export`: the checkpoint eval.checkpoint names, as
    a Hugging Face model folder with its tokenizer."""

    out: str | None = key(
        None, NOT_SETTING, "the folder; none: WORKDIR/export", rule=r.FOLDER_TO_WRITE, common=True
    )
    dtype: c.ExportDtype = key(c.ExportDtype.bf16, OUTPUT, "the weights' dtype", common=True)
    shard_gb: float = key(
        5.0, OUTPUT, "the most weight bytes in one safetensors file", rule=POSITIVE
    )


@dataclass
class ClusterConfig:
    name: c.ClusterName = command(c.ClusterName.local, "local or slurm")
    executor: c.Executor = command(c.Executor.inprocess, "local: inprocess | subprocess")
    nodes: int = command(1, "nodes of the training job", rule=AT_LEAST_ONE, common=True)
    gpus_per_node: int = command(0, "GPUs per node", rule=NOT_NEGATIVE, common=True)
    tasks_per_node: int | None = command(
        None, "training ranks per node; none: one per GPU", rule=AT_LEAST_ONE
    )
    cpus_per_task: int = command(2, "CPUs per task", rule=AT_LEAST_ONE)
    mem_gb: int | None = command(None, "memory per node", rule=AT_LEAST_ONE)
    partition: str | None = command(None, "the Slurm partition", script=True, common=True)
    cpu_partition: str | None = command(
        None, "for tokenizer, tokenize and verify jobs; none: partition", script=True
    )
    account: str | None = command(None, "the Slurm account", script=True, common=True)
    qos: str | None = command(None, "the Slurm QOS", script=True)
    time_limit: str = command("04:00:00", "of GPU jobs", rule=r.SLURM_TIME, common=True)
    cpu_time_limit: str = command("02:00:00", "of CPU jobs", rule=r.SLURM_TIME)
    array_parallelism: int = command(64, "tokenize tasks at once", rule=AT_LEAST_ONE)
    setup: list[str] = command(help="shell lines each job runs first", factory=list)
    sbatch_extra: dict[str, Any] = command(
        help="more #SBATCH options", factory=dict, rule=r.SBATCH_OPTIONS, script=True
    )
    env: dict[str, str] = command(
        help="exported in each job script (NCCL_SOCKET_IFNAME, ...)",
        factory=dict,
        rule=r.ENVIRONMENT,
        script=True,
    )
    srun_args: list[str] = command(
        help="more options of the tasks' srun", factory=list, script=True
    )
    # pyxis/enroot: srun --container-image, --container-mounts
    container_image: str | None = command(None, "a container for the tasks", script=True)
    container_mounts: list[str] = command(
        help="SRC:DST[:FLAGS]", factory=list, rule=r.MOUNTS, script=True
    )
    gpu: str | None = command(None, "GPU model, e.g. H100: peak FLOP/s, memory and fp8")
    gpu_memory_gb: float | None = command(None, "none: that of cluster.gpu, when known")
    # The planner's machine model (pipeline.planning.hardware); none: cluster.gpu's preset
    peak_tflops: float | None = command(
        None, "dense bf16 peak per GPU, TFLOP/s (fp8: twice this)", rule=POSITIVE
    )
    hbm_gbps: float | None = command(None, "GPU memory bandwidth, GB/s", rule=POSITIVE)
    nvlink_gbps: float | None = command(
        None, "NVLink bandwidth per GPU and direction, GB/s", rule=POSITIVE
    )
    network_gbps: float | None = command(
        None, "network bandwidth per GPU and direction, GB/s", rule=POSITIVE
    )
    nvlink_domain: int | None = command(
        None, "GPUs joined by NVLink; none: a node (72 for GB200)", rule=AT_LEAST_ONE
    )
    checkpoint_write_gbps: float = command(
        1.0, "the checkpoint filesystem's write GB/s", rule=POSITIVE
    )
    rendezvous_timeout_s: float = command(300.0, "a rank's wait for every rank to start")


@dataclass
class ResilienceConfig:
    """Fault tolerance (pipeline.resilience): hangs, stragglers, restarts in the allocation,
    requeues, the Slurm warning before the time limit, saves that fail for space."""

    hang_timeout_s: float | None = command(
        None,
        "a training rank without progress this long ends the attempt; none: 10x the slowest "
        "step (60 s at least, 900 s before the first step and in loads); a save gets 10x the "
        "slowest save once one is measured (900 s before); 0: off",
        rule=NOT_NEGATIVE,
    )
    straggler_threshold: float = command(
        0.1,
        "a rank whose own work per step exceeds the median's by this share is named",
        rule=POSITIVE,
    )
    max_restarts: int = command(
        3,
        "times a training job restarts its ranks in its allocation after a fault, from the "
        "newest checkpoint; then it requeues itself without the nodes at fault",
        rule=NOT_NEGATIVE,
        common=True,
    )
    spare_nodes: int = command(
        0,
        "nodes a training job holds beyond cluster.nodes, each to take a faulty node's place",
        rule=NOT_NEGATIVE,
        common=True,
    )
    # Settings replayed from the run's history, as before they moved here from train.*
    max_requeues: int = key(
        20, NOT_SETTING, "requeues at time limits and after faults", rule=NOT_NEGATIVE, common=True
    )
    exit_signal_lead_s: int = key(120, NOT_SETTING, "Slurm's warning before the time limit")
    max_failed_saves: int = key(
        3,
        NOT_SETTING,
        "saves in a row that may fail for space, skipped, before the run stops",
        rule=AT_LEAST_ONE,
    )


@dataclass
class WandbConfig:
    """Weights & Biases: the logging rank's metrics, the config and the results."""

    # offline: compute nodes without internet; `wandb sync` from the login node uploads it
    mode: c.WandbMode = key(
        c.WandbMode.disabled,
        NOT_SETTING,
        "log to W&B; offline: files in the run folder",
        common=True,
    )
    project: str = key("pipeline", NOT_SETTING, "the W&B project")
    entity: str | None = key(None, NOT_SETTING, "the W&B team or user; none: the account's own")
    group: str | None = key(None, NOT_SETTING, "runs shown together; none: a sweep's points")
    tags: list[str] = key(role=NOT_SETTING, help="the W&B run's tags", factory=list)


@dataclass
class MlflowConfig:
    """MLflow: what W&B receives, to an MLflow tracking store."""

    enabled: bool = key(False, NOT_SETTING, "log the run to MLflow", common=True)
    # a server (http://host:5000) or a store; none: a file store in the run folder (a sweep's
    # points: in the sweep folder), read with `mlflow ui --backend-store-uri PATH`
    tracking_uri: str | None = key(None, NOT_SETTING, "an MLflow server; none: WORKDIR/mlruns")
    experiment: str = key("pipeline", NOT_SETTING, "the MLflow experiment")


@dataclass
class LoggingConfig:
    """Experiment trackers, each optional: one that is off is never imported."""

    wandb: WandbConfig = field(default_factory=WandbConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)


@dataclass
class PipelineConfig:
    workdir: str = command(
        MISSING, "the run folder", rule=r.FOLDER_TO_WRITE, script=True, common=True
    )
    stages: list[str] = command(
        help="the stages to run",
        factory=lambda: list(DEFAULT_STAGES),
        rule=r.in_order(STAGES),
        common=True,
    )
    dry_run: bool = command(False, "plan and show the jobs, run nothing")
    # what they held is moved to replaced/ in the run folder
    force: str | None = command(None, "redo this step and every step after it", common=True)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    resilience: ResilienceConfig = field(default_factory=ResilienceConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
