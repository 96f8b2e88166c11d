"""The values left to the planner (auto): parallel.tensor, parallel.pipeline,
train.micro_batch_size and train.recompute, chosen once when the config is loaded, before
anything runs or is submitted.

Every open combination (tensor and pipeline sizes that divide the job's GPUs and the model,
micro-batches that divide the global batch over the data-parallel ranks, each recompute mode)
is estimated for memory (pipeline.planning.memory) and speed (pipeline.planning.throughput) by
the one layout search (pipeline.planning.search), under the constraints the config sets.
Of those whose estimate leaves MARGIN of the GPU free, the fastest by the estimate is taken,
with two allowances for what the estimate cannot tell apart: between parallel layouts within
LAYOUT_TIE of the fastest, the one with the least model parallelism (tensor x pipeline), as its
communication terms are the least certain part of the estimate; then between options within
TIE, the one with the least memory, as the memory left over is worth more. A run that resumes keeps the tensor and
pipeline sizes its checkpoint was saved with. The choice, and why, is kept in
train.auto_choice, printed at launch and in the training log.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeline.config import PipelineConfig
from pipeline.config.choices import RECOMPUTE_MODES
from pipeline.config.derived import sequence_parallel, trains_on_gpu, world_size
from pipeline.config.schema import AUTO
from pipeline.core.errors import ConfigError
from pipeline.core.paths import RunPaths
from pipeline.data.datasets import vocab_size
from pipeline.model.sizes import ffn_hidden_size
from pipeline.model.stages import PipelineSplit
from pipeline.planning import hardware, run_gpu
from pipeline.planning.hardware import Hardware
from pipeline.planning.parallel_layout import ParallelLayout
from pipeline.planning.search import (
    Constraints,
    base_layout,
    divisors,
    parallel_sizes,
    search,
)
from pipeline.planning.units import GIB
from pipeline.runtime import gpus
from pipeline.training.checkpoint_records import tracked_state

# Kept free beyond the estimate: its error against torch's measured peak (2-7% below it on
# the H200, docs/benchmarks.md), and what fragmentation adds in a long run.
MARGIN = 0.10
TIE = 0.01  # estimates closer than this are not told apart
LAYOUT_TIE = 0.05  # nor, for the parallel layout, closer than this
CPU_MICRO_BATCH = 8  # ranks on CPUs: the most, up to this, that divides the batch


@dataclass(frozen=True)
class Option:
    layout: ParallelLayout
    memory: int  # bytes on the busiest GPU
    tokens_per_s: float  # per GPU, by the estimate


def auto_keys(cfg: PipelineConfig) -> list[str]:
    """The keys left to the planner, in the order a user would look for them."""
    p, t = cfg.parallel, cfg.train
    values = {
        "train.micro_batch_size": t.micro_batch_size,
        "train.recompute": t.recompute,
        "parallel.tensor": p.tensor,
        "parallel.pipeline": p.pipeline,
    }
    return [key for key, value in values.items() if value == AUTO]


def wants_choice(cfg: PipelineConfig) -> bool:
    return bool(auto_keys(cfg))


def gpu_capacity(cfg: PipelineConfig) -> tuple[int, str, str]:
    """Bytes a training GPU holds, what they were read from, and the GPU's name: those of the
    run's GPU (pipeline.planning.run_gpu), which must be named or found here."""
    gpu = run_gpu.of(cfg)
    if gpu is not None and not gpu.assumed and gpu.capacity is not None:
        return gpu.capacity, gpu.source, gpu.name
    if cfg.cluster.gpu:  # named, and not one the planner knows the memory of
        known = ", ".join(gpus.GPUS)
        raise ConfigError(
            f"cluster.gpu: {cfg.cluster.gpu} is not a GPU the planner knows ({known}); set "
            "cluster.gpu_memory_gb for the auto values, or give them"
        )
    here = " (nvidia-smi finds none here: to run here, use train=cpu)"
    here = "" if cfg.cluster.executor == "slurm" else here
    raise ConfigError(
        f"{auto_keys(cfg)[0]}: auto needs the GPUs' memory{here}; set cluster.gpu "
        "(H100, H200, ...) or cluster.gpu_memory_gb, or give "
        f"{', '.join(auto_keys(cfg))} a value"
    )


def constraints(cfg: PipelineConfig) -> tuple[Constraints, str]:
    """The search's constraints for the run's open values (TP and PP sizes, micro-batches,
    recompute modes; sequence parallelism and virtual stages as the run uses them), and why
    when a resume fixes the TP and PP sizes."""
    p, t = cfg.parallel, cfg.train
    tensors = None if p.tensor == AUTO else (p.tensor,)
    pipelines = None if p.pipeline == AUTO else (p.pipeline,)
    kept = ""
    saved = None
    if AUTO in (p.tensor, p.pipeline):
        saved = (tracked_state(RunPaths.of(cfg.workdir)) or {}).get("layout")
    if saved and model_ranks(cfg) % (saved["tensor"] * saved["pipeline"]) == 0:
        was = (saved["tensor"], saved["pipeline"])
        if all(given in (AUTO, w) for given, w in zip((p.tensor, p.pipeline), was, strict=True)):
            tensors, pipelines = (was[0],), (was[1],)
            kept = "as the checkpoint to resume was saved"
    return Constraints(
        tensors=tensors,
        pipelines=pipelines,
        search_virtual=False,
        virtual_pipeline=p.virtual_pipeline,
        recompute=RECOMPUTE_MODES if t.recompute == AUTO else (t.recompute,),
        sequence_parallel=p.sequence_parallel,
        experts=(p.expert,),  # a number the run gives (1: the experts whole on each rank)
    ), kept


def laid_out(cfg: PipelineConfig, tensor: int, pipeline: int) -> PipelineConfig:
    """The config under this tensor and pipeline size; sequence parallelism as the run would
    use it with that tensor size, virtual stages only with pipeline stages."""
    p = cfg.parallel
    virtual = p.virtual_pipeline if pipeline > 1 else None
    shaped = replace(cfg, parallel=replace(p, tensor=tensor, pipeline=pipeline))
    sequence = sequence_parallel(shaped)
    parallel = replace(shaped.parallel, sequence_parallel=sequence, virtual_pipeline=virtual)
    return replace(cfg, parallel=parallel)


def micro_batches(cfg: PipelineConfig, per_rank: int, fixed_layout: bool) -> list[int]:
    """The micro-batches open for a data-parallel rank's `per_rank` sequences: the one given,
    the one a given train.grad_accum fixes, else every divisor of them. `fixed_layout`: the
    layout is the user's, so a batch that does not split is their error."""
    t = cfg.train
    if t.grad_accum is not None and (t.micro_batch_size == AUTO or t.hold_global_batch):
        if per_rank % t.grad_accum == 0:
            return [per_rank // t.grad_accum]
        if fixed_layout:
            raise ConfigError(
                f"train.grad_accum: {t.grad_accum} does not divide the {per_rank} sequences of "
                f"train.global_batch_size={t.global_batch_size} per data-parallel rank"
            )
        return []
    if t.micro_batch_size != AUTO:
        fits = per_rank % t.micro_batch_size == 0
        matches = t.grad_accum is None or per_rank == t.micro_batch_size * t.grad_accum
        return [t.micro_batch_size] if fits and matches or fixed_layout else []
    return divisors(per_rank)


def model_ranks(cfg: PipelineConfig) -> int:
    """The ranks that share out one copy of the model's layers: the context ranks split the
    sequence, not the layers."""
    return world_size(cfg.cluster) // cfg.parallel.context


def open_sizes(cfg: PipelineConfig, open_: Constraints) -> list[tuple[int, int]]:
    """The (tensor, pipeline) sizes the search opens for this run under `open_`."""
    split = PipelineSplit.of(cfg.parallel)
    ffn = ffn_hidden_size(cfg.model)
    return list(parallel_sizes(cfg.model, ffn, model_ranks(cfg), open_, split=split))


def options(
    cfg: PipelineConfig,
    vocab: int,
    hw: Hardware,
    open_: Constraints | None = None,
) -> list[Option]:
    """Every open combination with its estimates, fastest first, by the one layout search
    (`hw`: the run's GPUs and fabric, which weigh compute against communication: always
    given, so that no estimate falls back to another GPU; `open_`: the run's constraints,
    when the caller has them)."""
    open_ = open_ or constraints(cfg)[0]
    fixed = len(open_sizes(cfg, open_)) == 1
    open_ = replace(open_, micro_batches=lambda per_rank: micro_batches(cfg, per_rank, fixed))
    gpus_, global_batch = model_ranks(cfg), cfg.train.global_batch_size
    found = search(cfg.model, vocab, gpus_, global_batch, hw, base_layout(cfg), open_)
    return [Option(c.layout, c.memory["total"], c.tokens_per_s) for c in found.ranked()]


def choose(found: list[Option], capacity: int) -> tuple[Option, Option, Option | None]:
    """For GPUs of `capacity` bytes, among `found` (fastest first), in the least model
    parallelism within LAYOUT_TIE of the fastest that fits: the choice; the fastest that fits
    (the choice, or one within TIE of it with more memory); and the one of least memory among
    those faster than that which do not fit (None if there is none)."""
    if not found:
        raise ConfigError(
            "train.global_batch_size: no parallel layout and micro-batch divide it over the "
            "job's GPUs; give parallel.tensor, parallel.pipeline and train.micro_batch_size"
        )
    limit = capacity * (1 - MARGIN)
    fits = [o for o in found if o.memory <= limit]
    if fits:  # of the layouts about as fast as the fastest, the least model parallelism
        near = [o for o in fits if o.tokens_per_s >= fits[0].tokens_per_s * (1 - LAYOUT_TIE)]
        least = min(o.layout.tensor * o.layout.pipeline for o in near)
        found = [o for o in found if o.layout.tensor * o.layout.pipeline == least]
        fits = [o for o in fits if o.layout.tensor * o.layout.pipeline == least]
    else:
        least = min(found, key=lambda o: o.memory)
        raise ConfigError(
            f"train.micro_batch_size: auto found no layout, micro-batch and recompute that fit "
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
    """The config with the auto values as the planner chooses them, and train.auto_choice
    saying what and why; a config without auto values unchanged."""
    if cfg.train.auto_choice is not None:
        raise ConfigError(
            "train.auto_choice: is set by the planner (what the auto values became), not a setting"
        )
    if not wants_choice(cfg):
        return cfg
    if not trains_on_gpu(cfg):
        return _on_cpu(cfg)
    capacity, source, name = gpu_capacity(cfg)
    vocab = vocab_size(cfg)[0]
    open_, kept = constraints(cfg)  # read once: a resume's checkpoint records
    found = options(cfg, vocab, hardware.of(cfg, name), open_)
    chosen, best, too_big = choose(found, capacity)
    layout_open = AUTO in (cfg.parallel.tensor, cfg.parallel.pipeline)
    lo = chosen.layout
    why_layout = kept or "the only layout"
    if len(open_sizes(cfg, open_)) > 1:
        why_layout = f"the least model parallelism within {LAYOUT_TIE:.0%} of the fastest"
    where = f"TP={lo.tensor} PP={lo.pipeline} DP={lo.data} ({why_layout})"
    why = (
        f"{where + ', ' if layout_open else ''}micro-batch {lo.micro_batch} x accumulation "
        f"{lo.grad_accum}, recompute {lo.recompute} (~{chosen.memory / GIB:.1f} GiB): of those "
        f"needing at most {1 - MARGIN:.0%} of {capacity / GIB:.1f} GiB ({source}), the fastest "
        "by the planner's estimate"
    )
    if best is not chosen:
        gain = best.tokens_per_s / chosen.tokens_per_s - 1
        why += (
            f"; {_name(best)} is estimated {gain:.1%} faster, within {TIE:.0%} "
            f"(taken as equal), and needs ~{best.memory / GIB:.1f} GiB"
        )
    if too_big is not None:
        why += f"; {_name(too_big)} would need ~{too_big.memory / GIB:.1f} GiB"
    return _with(laid_out(cfg, lo.tensor, lo.pipeline), cfg, lo.micro_batch, lo.recompute, why)


def _on_cpu(cfg: PipelineConfig) -> PipelineConfig:
    """CPU ranks: no model of their speed; data parallelism, and the CPU default micro-batch."""
    asked = (cfg.parallel.tensor, cfg.parallel.pipeline)
    shaped = laid_out(cfg, *(1 if size == AUTO else size for size in asked))
    data = world_size(cfg.cluster) // (shaped.parallel.tensor * shaped.parallel.pipeline)
    per_rank = cfg.train.global_batch_size // data
    open_ = micro_batches(cfg, per_rank, fixed_layout=True) or [1]
    micro = max([m for m in open_ if m <= CPU_MICRO_BATCH] or [min(open_)])
    recompute = "none" if cfg.train.recompute == AUTO else cfg.train.recompute
    p = shaped.parallel
    where = f"TP={p.tensor} PP={p.pipeline}, " if AUTO in asked else ""
    why = f"{where}micro-batch {micro}, recompute {recompute} (CPU ranks: up to {CPU_MICRO_BATCH})"
    return _with(shaped, cfg, micro, recompute, why)


def _with(
    shaped: PipelineConfig, asked: PipelineConfig, micro: int, recompute: str, why: str
) -> PipelineConfig:
    keys = {
        "parallel.tensor": asked.parallel.tensor,
        "parallel.pipeline": asked.parallel.pipeline,
        "train.micro_batch_size": asked.train.micro_batch_size,
        "train.recompute": asked.train.recompute,
    }
    named = ", ".join(f"{key}=auto" for key, value in keys.items() if value == AUTO)
    choice = f"{named}: {why}"
    train = replace(shaped.train, micro_batch_size=micro, recompute=recompute, auto_choice=choice)
    return replace(shaped, train=train)
