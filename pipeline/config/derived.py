"""Values derived from the config, each computed in one place: ranks, the batch arithmetic,
Slurm times, the values the planner settles. `resolve` returns the config with the derived
batch sizes filled in; the config it is given is left as it was."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from pipeline.config import slurm_time
from pipeline.config.choices import Recompute
from pipeline.config.schema import AUTO, ClusterConfig, PipelineConfig
from pipeline.core.errors import ConfigError


def slurm_minutes(limit: str, key: str) -> int:
    """Slurm's [days-]hours:minutes:seconds, hours:minutes:seconds or minutes, as whole
    minutes (seconds round up); no Slurm time is a ConfigError naming `key`."""
    found = slurm_time.minutes(limit)
    if found is None:
        raise ConfigError(f"{key}: {limit!r} is not a Slurm time ([days-]hh:mm:ss)")
    return found


def tasks_per_node(cluster: ClusterConfig) -> int:
    """Training ranks per node: as given, else one per GPU (one on CPU nodes)."""
    return cluster.tasks_per_node or cluster.gpus_per_node or 1


def world_size(cluster: ClusterConfig) -> int:
    """Ranks of the training job: nodes x tasks per node (one task per GPU)."""
    return cluster.nodes * tasks_per_node(cluster)


def data_parallel_size(cfg: PipelineConfig) -> int:
    p = cfg.parallel
    return world_size(cfg.cluster) // (p.tensor * p.pipeline * p.context)


@dataclass(frozen=True)
class Settled:
    """The values a config may leave to the planner (`auto`, pipeline.planning.auto), as the
    run uses them once they are settled. The config keeps them under their keys, so config.yaml
    and the records read as given; what runs after settling reads them here, typed."""

    tensor: int
    pipeline: int
    micro_batch_size: int
    recompute: Recompute


def settled(cfg: PipelineConfig) -> Settled:
    """The settled values of a config the command line loaded (pipeline.config.compose.load)."""
    p, t = cfg.parallel, cfg.train
    numbers = (p.tensor, p.pipeline, t.micro_batch_size)
    if t.recompute == AUTO or not all(type(n) is int for n in numbers):
        raise ValueError(f"not settled (pipeline.planning.auto): {numbers}, {t.recompute}")
    return Settled(p.tensor, p.pipeline, t.micro_batch_size, Recompute(t.recompute))


def validation_samples(cfg: PipelineConfig) -> int:
    """Sequences each validation reads: train.eval_samples, or for a config of an earlier
    version train.eval_iters micro-batches on each data-parallel rank."""
    t = cfg.train
    if t.eval_iters is not None:
        return t.eval_iters * settled(cfg).micro_batch_size * data_parallel_size(cfg)
    return t.eval_samples


def trains_on_gpu(cfg: PipelineConfig) -> bool:
    """Whether the training job is meant for GPUs, as the config says (the launcher may run on
    a login node without any)."""
    device = cfg.train.device
    return device == "cuda" or (device == "auto" and cfg.cluster.gpus_per_node > 0)


def sequence_parallel(cfg: PipelineConfig) -> bool:
    """parallel.sequence_parallel as the run uses it: as given, else on whenever the run has
    tensor parallelism on GPUs (megatron-core's sequence parallelism needs CUDA)."""
    p = cfg.parallel
    if p.sequence_parallel is not None:
        return p.sequence_parallel
    return type(p.tensor) is int and p.tensor > 1 and trains_on_gpu(cfg)


@dataclass(frozen=True)
class Batch:
    """global = micro x data-parallel size x accumulation."""

    micro: int
    grad_accum: int
    data_parallel: int

    @property
    def global_size(self) -> int:
        return self.micro * self.data_parallel * self.grad_accum


def batch(cfg: PipelineConfig) -> Batch:
    """The micro-batch size and accumulation the run uses. train.grad_accum is derived from the
    two batch sizes when not given; with train.hold_global_batch (sweeps over accumulation) the
    micro-batch size is derived instead. An inconsistent triple is a ConfigError."""
    t = cfg.train
    dp = data_parallel_size(cfg)
    micro = t.micro_batch_size
    if micro == AUTO:
        raise ValueError("train.micro_batch_size=auto: not settled (pipeline.planning.auto)")
    if t.hold_global_batch and t.grad_accum is not None:
        if t.global_batch_size % (t.grad_accum * dp):
            raise ConfigError(
                f"train.grad_accum: {t.grad_accum} x data-parallel size {dp} does not divide "
                f"train.global_batch_size={t.global_batch_size}"
            )
        micro = t.global_batch_size // (t.grad_accum * dp)
    per_step = micro * dp
    if t.grad_accum is None:
        if t.global_batch_size % per_step:
            raise ConfigError(
                f"train.global_batch_size: {t.global_batch_size} is not a multiple of "
                f"train.micro_batch_size x data-parallel size = {micro} x {dp}"
            )
        return Batch(micro, t.global_batch_size // per_step, dp)
    if t.global_batch_size != per_step * t.grad_accum:
        raise ConfigError(
            f"train.global_batch_size: {t.global_batch_size} != train.micro_batch_size x "
            f"data-parallel size x train.grad_accum = {micro} x {dp} x {t.grad_accum}"
        )
    return Batch(micro, t.grad_accum, dp)


def given_tokenizer(cfg: PipelineConfig) -> str | None:
    """The sentencepiece model the run tokenizes with when it trains none: tokenizer.model,
    else model.init_from's own tokenizer.model."""
    if cfg.tokenizer.model or not cfg.model.init_from:
        return cfg.tokenizer.model
    return os.path.join(cfg.model.init_from, "tokenizer.model")


def resolve(cfg: PipelineConfig) -> PipelineConfig:
    """A copy of a checked config with train.micro_batch_size, train.grad_accum (see
    `batch`), parallel.sequence_parallel (see `sequence_parallel`) and the tokenizer (see
    `given_tokenizer`) as the run uses them."""
    if AUTO in (cfg.train.recompute, cfg.parallel.tensor, cfg.parallel.pipeline):
        raise ValueError("auto values not settled (pipeline.planning.auto)")
    b = batch(cfg)
    train = dataclasses.replace(cfg.train, micro_batch_size=b.micro, grad_accum=b.grad_accum)
    tokenizer = cfg.tokenizer
    model = given_tokenizer(cfg)
    if model:  # tokenizer.vocab_size trains a tokenizer: beside a given one it says nothing
        tokenizer = dataclasses.replace(tokenizer, model=model, vocab_size=None)
    parallel = dataclasses.replace(cfg.parallel, sequence_parallel=sequence_parallel(cfg))
    return dataclasses.replace(cfg, train=train, tokenizer=tokenizer, parallel=parallel)
