"""Checks before anything is submitted: what would otherwise fail after hours in the queue is
refused in one line naming the key."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

from pipeline.config import PipelineConfig
from pipeline.config.derived import slurm_minutes, world_size
from pipeline.config.split_weights import Split
from pipeline.core.errors import ConfigError
from pipeline.core.paths import RunPaths
from pipeline.data import mixture, rejects, shards
from pipeline.data.datasets import check_data, load_manifest
from pipeline.data.tokenizer import load as load_tokenizer
from pipeline.model.huggingface import architectures
from pipeline.model.huggingface import files as hf_files
from pipeline.model.huggingface import tokenizer as hf_tokenizer
from pipeline.model.sizes import padded_vocab
from pipeline.planning.run_gpu import RunGpu
from pipeline.planning.run_plan import Plan
from pipeline.planning.search import search_layouts
from pipeline.planning.units import gib
from pipeline.runtime import gpus
from pipeline.training import checkpoint_records

# Time a saving job needs besides writing: agreeing on the signal, finishing the step, syncing.
SAVE_MARGIN_S = 10.0


def check_stage_inputs(cfg: PipelineConfig) -> None:
    """A stage run alone needs the outputs of the stages before it (tokenized data of its
    own, or of the run data.prepared names); tokenized data already there must be of this
    version and hold what the stages read."""
    if "export" in cfg.stages:  # the model and the export folder first: no data read for them
        check_export(cfg)
    paths = RunPaths.of(cfg.workdir)
    data = RunPaths.of(cfg.data.prepared) if cfg.data.prepared else paths
    if "tokenize" not in cfg.stages and not data.manifest.exists():
        raise ConfigError(f"stages: no tokenized data in {data.data_dir}; add tokenize to stages")
    if "tokenize" in cfg.stages and not cfg.data.prepared and not data.manifest.exists():
        rejects.refuse_unreadable_inputs(cfg.data, paths)
    forced = None if cfg.data.prepared else cfg.force  # what force=STEP moves aside
    if forced not in ("tokenizer", "tokenize"):
        shards.refuse_earlier_format(data)
    redone = forced in ("tokenizer", "tokenize", "verify")
    if data.manifest.exists() and not redone and {"train", "evaluate"} & set(cfg.stages):
        manifest = load_manifest(data)
        # another data.split is a change of the tokenized data: the rerun check names it and
        # force=tokenize, rather than sizing the splits cut with the old one
        same = Split.of(cfg.data.split).weights == Split.of(manifest["split"]).weights
        if same or cfg.data.prepared:
            check_data(cfg, manifest)
    reads_checkpoint = {"evaluate", "export"} & set(cfg.stages) and "train" not in cfg.stages
    named = str(cfg.eval.checkpoint) in ("best", "latest")
    if reads_checkpoint and named and not paths.checkpoints.exists():
        raise ConfigError(f"stages: no checkpoints in {paths.checkpoints}; add train to stages")


def check_export(cfg: PipelineConfig) -> None:
    """The model has a transformers equivalent, and the export would not overwrite a folder
    that is not an export."""
    architectures.architecture(cfg.model)
    hf_files.refuse_foreign(Path(cfg.export.out or RunPaths.of(cfg.workdir).export_dir))
    trained = RunPaths.of(cfg.data.prepared or cfg.workdir).tokenizer_model
    existing = cfg.tokenizer.model or (trained if trained.exists() else None)
    if existing:
        why = hf_tokenizer.unsupported(Path(existing))
    else:
        why = hf_tokenizer.unsupported_settings(cfg.tokenizer)
    if why:
        raise ConfigError(f"stages: export needs a tokenizer transformers reproduces; {why}")


def check_init_from(cfg: PipelineConfig, plan: Plan) -> None:
    """model.init_from is a Llama of this run's model shape, with an embedding row for every
    piece of the tokenizer and no more than the padded vocabulary holds."""
    vocab_size = plan.data.vocab_size
    folder = Path(cfg.model.init_from)
    hf = hf_files.read_config(folder)
    differs = architectures.mismatch(cfg.model, hf)
    if differs:
        raise ConfigError(f"model.init_from={folder}: {differs}")
    if not RunPaths.of(cfg.workdir).manifest.exists():  # not tokenized yet: its own count
        vocab_size = load_tokenizer(cfg.tokenizer.model).vocab_size()
    rows = (hf_files.shape(folder, "model.embed_tokens.weight") or [0])[0]
    padded = padded_vocab(vocab_size, cfg.model, plan.layout.tensor)
    if not vocab_size <= rows <= padded:
        raise ConfigError(
            f"model.init_from={folder}: its embedding has {rows} rows, the tokenizer "
            f"({cfg.tokenizer.model}) {vocab_size} pieces, padded to {padded} here; they must "
            "be of that tokenizer"
        )


def checkpoint_bytes(parameters: int, precision: str) -> int:
    """What one save of a model of `parameters` writes over all ranks: weights and optimizer
    state (fp32 main weights and two Adam moments in mixed precision), whatever the layout."""
    return parameters * (12 if precision == "fp32" else 14)


def _local_gpu() -> bool:
    """Whether this machine has an NVIDIA GPU, without importing torch (seconds)."""
    return os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi") is not None


def _check_device(cfg: PipelineConfig, plan: Plan) -> None:
    t, on_gpu = cfg.train, plan.on_gpu
    # an evaluation alone runs in fp32 on a CPU, whatever precision trained the weights
    if not on_gpu and t.precision != "fp32" and "train" in cfg.stages:
        raise ConfigError(
            f"train.precision: {t.precision} needs GPUs (cluster.gpus_per_node); use fp32 on CPU"
        )
    if cfg.parallel.context > 1 and "train" in cfg.stages:
        # megatron-core splits attention over the sequence with Transformer Engine only; the
        # batch split by sequence waits for a machine with several GPUs to be run on
        why = "is planned only, not trained yet" if on_gpu else "needs GPUs"
        raise ConfigError(
            f"parallel.context: context parallelism {why} (python -m pipeline.plan estimates "
            "it); use 1"
        )
    if not on_gpu and cfg.parallel.sequence_parallel:
        raise ConfigError("parallel.sequence_parallel: needs GPUs; use false on CPU")
    if not on_gpu and plan.layout.pipeline > 1 and not cfg.model.untie_embeddings:
        raise ConfigError(
            "parallel.pipeline: pipeline stages on CPU need model.untie_embeddings=true "
            "(megatron-core keeps the output copy of a tied embedding on a GPU)"
        )
    if on_gpu and cfg.cluster.executor != "slurm" and not _local_gpu():
        raise ConfigError(
            "train.device: GPUs asked for (train=gpu or cluster.gpus_per_node), but this "
            "machine has none; use train=cpu here, or cluster=slurm to submit to GPU nodes"
        )


def check_fp8(cfg: PipelineConfig, gpu: RunGpu | None) -> None:
    """fp8 on the run's GPU (named or found here) needs its fp8 tensor cores."""
    if cfg.train.precision != "fp8" or gpu is None or gpu.assumed:
        return
    if gpu.capability is not None and gpu.capability < gpus.FP8_CAPABILITY:
        cc = ".".join(map(str, gpu.capability))
        raise ConfigError(
            f"train.precision: fp8 needs compute capability 8.9 or newer (Ada, Hopper, "
            f"Blackwell); {gpu.name} ({gpu.source}) is {cc}: use bf16"
        )


def _check_processes(cfg: PipelineConfig) -> None:
    c = cfg.cluster
    ranks = world_size(c)
    if c.executor == "inprocess" and ranks > 1:
        raise ConfigError(
            f"cluster.executor: training takes {ranks} processes (cluster.nodes={c.nodes} x "
            f"{ranks // c.nodes} per node); the inprocess executor runs one: use "
            "cluster.executor=subprocess or cluster=slurm"
        )


def check_epochs(cfg: PipelineConfig, plan: Plan) -> None:
    """A training budget that would read a source more than data.max_epochs times, by the
    plan's training tokens."""
    problem = mixture.too_many_epochs(cfg, plan.data.train_tokens)
    if problem:
        raise ConfigError(problem)


def _check_host_memory(cfg: PipelineConfig, plan: Plan) -> None:
    """A CPU run whose ranks on a node would need more memory than the node has: this
    machine when run here, cluster.mem_gb (when given) on Slurm."""
    c = cfg.cluster
    if plan.on_gpu or (c.executor == "slurm" and not c.mem_gb):
        return
    ranks = world_size(c) // c.nodes
    need = ranks * plan.memory["total"]
    if c.executor == "slurm":
        have, where = c.mem_gb * 10**9, f"cluster.mem_gb={c.mem_gb} of a node"
    else:
        have, where = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine"
    if need > have:
        raise ConfigError(
            f"model: {ranks} CPU rank(s) of this model need ~{gib(need)}, more than the "
            f"{gib(have)} of {where}; choose a smaller model (model=tiny), or more memory"
        )


def _check_fits(cfg: PipelineConfig, plan: Plan) -> None:
    gpu = plan.gpu
    if gpu is None or gpu.assumed or gpu.capacity is None or not plan.on_gpu:
        return
    need, capacity = plan.memory["total"], gpu.capacity
    if need <= capacity:
        return
    ranks = world_size(cfg.cluster)
    per_node = cfg.cluster.gpus_per_node
    found = search_layouts(
        cfg, plan.data.vocab_size, ranks, 0, per_node, plan.hardware, capacity=capacity
    )
    if found.feasible:
        lo = found.feasible[0].layout
        turned_on = lo.sequence_parallel and not cfg.parallel.sequence_parallel
        hint = (
            f"the best layout that fits: parallel.tensor={lo.tensor} "
            f"parallel.pipeline={lo.pipeline} train.micro_batch_size={lo.micro_batch} "
            f"train.recompute={lo.recompute}"
            + (" parallel.sequence_parallel=true" if turned_on else "")
        )
    else:
        hint = f"no layout of {ranks} GPUs fits: use more GPUs"
    raise ConfigError(
        f"train.micro_batch_size: {plan.layout.describe()} needs ~{gib(need)} per GPU, "
        f"more than the {gib(capacity)} of each {gpu.name} ({gpu.source}); {hint} "
        "(python -m pipeline.plan --search)"
    )


def _check_time_limit(cfg: PipelineConfig, plan: Plan) -> None:
    """The warning signal must leave time to finish the step and save; the limit must leave
    time to train before the signal."""
    if cfg.cluster.executor != "slurm":
        return
    t, c, lead_s = cfg.train, cfg.cluster, cfg.resilience.exit_signal_lead_s
    # written once and hashed once by its writer; in the background, a save already in flight
    # when the signal comes is finished first
    writes = 3 if t.async_save else 2
    saved = checkpoint_bytes(plan.figures.parameters["total"], t.precision)
    save_s = writes * saved / (c.checkpoint_write_gbps * 1e9)
    step_s = plan.step["step_s"] if plan.on_gpu and plan.gpu is not None else 0.0
    need = save_s + step_s + SAVE_MARGIN_S
    if lead_s < need:
        raise ConfigError(
            f"resilience.exit_signal_lead_s: {lead_s} s may not be enough to finish a step "
            f"(~{step_s:.0f} s) and save {gib(saved)} "
            f"(~{save_s:.0f} s at cluster.checkpoint_write_gbps={c.checkpoint_write_gbps:g}); "
            f"set at least {math.ceil(need)}"
        )
    limit_s = slurm_minutes(c.time_limit, "cluster.time_limit") * 60
    if limit_s <= lead_s + need:
        raise ConfigError(
            f"cluster.time_limit: {c.time_limit} leaves no time to train before the save "
            f"signal {lead_s} s before the end; make it longer"
        )


def check_training(cfg: PipelineConfig, plan: Plan) -> None:
    """What would otherwise fail after hours in the queue, refused before anything is
    submitted: GPU settings without GPUs, fp8 without fp8 tensor cores, a layout that does not
    fit the GPUs' memory, a time limit or signal lead too short to save a checkpoint, a CPU
    resume under another layout; each against the run's `plan`. Raises ConfigError."""
    _check_device(cfg, plan)
    _check_processes(cfg)
    check_fp8(cfg, plan.gpu)
    _check_fits(cfg, plan)
    _check_host_memory(cfg, plan)
    _check_time_limit(cfg, plan)
    _check_resume_layout(cfg, plan)
    if cfg.model.init_from:
        check_init_from(cfg, plan)


def _check_resume_layout(cfg: PipelineConfig, plan: Plan) -> None:
    paths = RunPaths.of(cfg.workdir)
    if "train" not in cfg.stages or paths.train_done.exists():
        return
    problem = checkpoint_records.layout_problem(
        checkpoint_records.tracked_state(paths),
        {
            "tensor": plan.layout.tensor,
            "pipeline": plan.layout.pipeline,
            "expert": plan.layout.expert,
            "virtual_pipeline": cfg.parallel.virtual_pipeline,
            "account_for_embedding": cfg.parallel.account_for_embedding,
            "account_for_loss": cfg.parallel.account_for_loss,
            "backend": plan.backend,
            "padded_vocab_size": plan.figures.padded_vocab,
        },
    )
    if problem:
        raise ConfigError(f"{problem[0]}: {problem[1]}")
