"""train.micro_batch_size=auto and train.recompute=auto: the planner's choice, made once when
the config is loaded, before anything runs.

Within the configured parallel layout (tensor, pipeline, data-parallel size, precision), every
micro-batch that divides the global batch over the data-parallel ranks, with each recompute
mode, is estimated for memory (pipeline.planning.memory) and speed
(pipeline.planning.throughput). Of those whose estimate leaves MARGIN of the GPU free, the
fastest by the estimate is taken, or the one with the least memory among those within
TIE of it: the estimate cannot tell such candidates apart, and the memory left over is worth
more. The result, and why, is kept in train.auto_choice, printed at launch and in the log.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeline.config import PipelineConfig
from pipeline.config.derived import batch, data_parallel_size, trains_on_gpu
from pipeline.config.schema import AUTO
from pipeline.core.errors import ConfigError
from pipeline.data.datasets import vocab_size
from pipeline.planning.memory import memory_per_gpu
from pipeline.planning.parallel_layout import ParallelLayout
from pipeline.planning.preflight import gpu_memory_gb
from pipeline.planning.search import RECOMPUTE_MODES
from pipeline.planning.throughput import expected_step
from pipeline.planning.units import GIB
from pipeline.runtime import gpus

# Kept free beyond the estimate: its error against torch's measured peak (tests/gpu, about
# 5%), and what fragmentation and the caching allocator add in a long run.
MARGIN = 0.10
TIE = 0.01  # estimates closer than this are not told apart
CPU_MICRO_BATCH = 8  # ranks on CPUs: the most, up to this, that divides the batch


@dataclass(frozen=True)
class Option:
    layout: ParallelLayout
    memory: int  # bytes on the busiest GPU
    tokens_per_s: float  # per GPU, by the estimate


def wants_choice(cfg: PipelineConfig) -> bool:
    return AUTO in (cfg.train.micro_batch_size, cfg.train.recompute)


def gpu_capacity(cfg: PipelineConfig) -> tuple[int, str]:
    """Bytes a training GPU holds, and what they were read from: cluster.gpu_memory_gb or
    cluster.gpu, else (jobs run here) this machine's GPU."""
    given = gpu_memory_gb(cfg)
    if given:
        what = f"cluster.gpu={cfg.cluster.gpu}" if cfg.cluster.gpu else "cluster.gpu_memory_gb"
        return gpus.capacity_bytes(given), what
    local = gpus.local_gpu() if cfg.cluster.executor != "slurm" else None
    if local is None:
        here = (
            ""
            if cfg.cluster.executor == "slurm"
            else " (nvidia-smi finds none here: to run here, use train=cpu)"
        )
        raise ConfigError(
            f"train.micro_batch_size: auto needs the GPUs' memory{here}; set cluster.gpu "
            "(H100, H200, ...) or cluster.gpu_memory_gb, or give train.micro_batch_size and "
            "train.recompute"
        )
    name, memory_gib = local
    return int(memory_gib * GIB), f"this machine's {name}"


def micro_batches(cfg: PipelineConfig) -> list[int]:
    """The micro-batches the config leaves open: the one given; the one train.grad_accum
    fixes; else every divisor of the global batch's share of a data-parallel rank."""
    t = cfg.train
    if t.micro_batch_size != AUTO:
        return [batch(cfg).micro]
    per_rank = t.global_batch_size // data_parallel_size(cfg)
    if t.grad_accum is None:
        return [m for m in range(1, per_rank + 1) if per_rank % m == 0]
    if per_rank % t.grad_accum:
        raise ConfigError(
            f"train.grad_accum: {t.grad_accum} does not divide the {per_rank} sequences of "
            f"train.global_batch_size={t.global_batch_size} per data-parallel rank"
        )
    return [per_rank // t.grad_accum]


def options(cfg: PipelineConfig, vocab: int) -> list[Option]:
    """Every micro-batch and recompute mode the config leaves open, with its estimates,
    fastest first."""
    t = cfg.train
    per_rank = t.global_batch_size // data_parallel_size(cfg)
    modes = RECOMPUTE_MODES if t.recompute == AUTO else (t.recompute,)
    one = replace(t, micro_batch_size=1, grad_accum=per_rank, recompute="none")
    base = ParallelLayout.of(replace(cfg, train=one))
    found = []
    for micro in micro_batches(cfg):
        for mode in modes:
            layout = replace(base, micro_batch=micro, grad_accum=per_rank // micro, recompute=mode)
            memory = memory_per_gpu(cfg.model, vocab, layout)["total"]
            speed = expected_step(cfg, vocab, layout)["tokens_per_s_per_gpu"]
            found.append(Option(layout, memory, speed))
    return sorted(found, key=lambda o: (-o.tokens_per_s, o.memory))


def choose(found: list[Option], capacity: int) -> tuple[Option, Option, Option | None]:
    """For GPUs of `capacity` bytes, among `found` (fastest first): the choice, the fastest
    that fits (the choice, or one within TIE of it with more memory), and the one of least
    memory among those faster than that which do not fit (None if there is none)."""
    limit = capacity * (1 - MARGIN)
    fits = [o for o in found if o.memory <= limit]
    if not fits:
        least = min(found, key=lambda o: o.memory)
        raise ConfigError(
            f"train.micro_batch_size: auto found no micro-batch and recompute that fit "
            f"{capacity / GIB:.1f} GiB with {MARGIN:.0%} to spare (the least, "
            f"{least.layout.describe()}, needs ~{least.memory / GIB:.1f} GiB); use more GPUs "
            "(parallel.tensor, parallel.pipeline) or a smaller model"
        )
    best = fits[0]
    close = [o for o in fits if o.tokens_per_s >= best.tokens_per_s * (1 - TIE)]
    chosen = min(close, key=lambda o: o.memory)
    too_big = [o for o in found if o.tokens_per_s > best.tokens_per_s and o.memory > limit]
    return chosen, best, min(too_big, key=lambda o: o.memory, default=None)


def _name(option: Option) -> str:
    return f"micro-batch {option.layout.micro_batch}, recompute {option.layout.recompute}"


def settle(cfg: PipelineConfig) -> PipelineConfig:
    """The config with train.micro_batch_size and train.recompute as the planner chooses them
    where they are auto, and train.auto_choice saying what and why; others unchanged."""
    if not wants_choice(cfg):
        return cfg
    t = cfg.train
    if not trains_on_gpu(cfg):  # no speed model of CPU ranks: the CPU default
        open_ = micro_batches(cfg)
        micro = max([m for m in open_ if m <= CPU_MICRO_BATCH] or [min(open_)])
        recompute = "none" if t.recompute == AUTO else t.recompute
        why = f"micro-batch {micro}, recompute {recompute} (CPU ranks: up to {CPU_MICRO_BATCH})"
        return _with(cfg, micro, recompute, why)
    capacity, source = gpu_capacity(cfg)
    vocab = vocab_size(cfg)[0]
    chosen, best, too_big = choose(options(cfg, vocab), capacity)
    lo = chosen.layout
    why = (
        f"micro-batch {lo.micro_batch} x accumulation {lo.grad_accum}, recompute "
        f"{lo.recompute} (~{chosen.memory / GIB:.1f} GiB): of those needing at most "
        f"{1 - MARGIN:.0%} of {capacity / GIB:.1f} GiB ({source}), the fastest by the "
        "planner's estimate"
    )
    if best is not chosen:
        gain = best.tokens_per_s / chosen.tokens_per_s - 1
        why += (
            f"; {_name(best)} is estimated {gain:.1%} faster, within {TIE:.0%} (taken as "
            f"equal), and needs ~{best.memory / GIB:.1f} GiB"
        )
    if too_big is not None:
        why += f"; {_name(too_big)} would need ~{too_big.memory / GIB:.1f} GiB"
    return _with(cfg, lo.micro_batch, lo.recompute, why)


def _with(cfg: PipelineConfig, micro: int, recompute: str, why: str) -> PipelineConfig:
    t = cfg.train
    asked = [f"{k}=auto" for k, v in (("micro_batch_size", t.micro_batch_size),
                                      ("recompute", t.recompute)) if v == AUTO]  # fmt: skip
    train = replace(
        t, micro_batch_size=micro, recompute=recompute, auto_choice=f"{', '.join(asked)}: {why}"
    )
    return replace(cfg, train=train)
