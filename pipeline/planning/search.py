"""The one search over parallel layouts: every (TP, PP, virtual stages, DP, expert parallelism
for MoE models, micro-batch, accumulation, recompute, sequence parallelism) of a model on N GPUs at a global batch, each
estimated for memory (pipeline.planning.memory) and speed (pipeline.planning.throughput), with
a reason for each layout it leaves out. What each caller may open is a `Constraints` argument:
the launcher's auto values (pipeline.planning.auto), `python -m pipeline.plan --search` and
the preflight hint (`search_layouts`), `--validate` and the scaling tables
(pipeline.planning.scaling) all enumerate here."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from pipeline.config import ModelConfig, PipelineConfig
from pipeline.config.choices import RECOMPUTE_MODES
from pipeline.model.figures import ModelFigures
from pipeline.model.stages import EVEN, PipelineSplit
from pipeline.planning import hardware
from pipeline.planning.hardware import Hardware
from pipeline.planning.memory import memory_per_gpu
from pipeline.planning.parallel_layout import ParallelLayout
from pipeline.planning.throughput import expected_step
from pipeline.planning.units import GIB
from pipeline.runtime.gpus import GPU_BY_MEMORY, capacity_bytes


@dataclass(frozen=True)
class Constraints:
    """What the search may open; each default opens everything the model allows."""

    tensors: tuple[int, ...] | None = None  # TP sizes allowed; None: every divisor of the GPUs
    max_tensor: int | None = None  # TP at most this (an NVLink domain)
    pipelines: tuple[int, ...] | None = None  # PP sizes allowed; None: every divisor
    # virtual stages: searched (None and every even split, where the schedule can run), or
    # this fixed number with pipeline stages
    search_virtual: bool = True
    virtual_pipeline: int | None = None
    # micro-batches open for a rank's share of the global batch; None: every divisor of it
    micro_batches: Callable[[int], Sequence[int]] | None = None
    recompute: tuple[str, ...] = RECOMPUTE_MODES
    sequence_parallel: bool | None = None  # None: on whenever TP > 1
    # MoE: EP sizes allowed; None: every divisor of the experts the ranks allow
    experts: tuple[int, ...] | None = None
    capacity: int | None = None  # bytes a GPU holds: a layout needing more is rejected


@dataclass(frozen=True)
class Candidate:
    layout: ParallelLayout
    memory: Mapping[str, int]  # bytes on the busiest GPU, by part (memory_per_gpu)
    throughput: Mapping[str, float]  # the expected step (expected_step)
    figures: ModelFigures  # the model's, for this layout's tensor and pipeline split

    @property
    def tokens_per_s(self) -> float:
        return self.throughput["tokens_per_s_per_gpu"]


@dataclass
class Search:
    feasible: list[Candidate] = field(default_factory=list)  # in the order searched
    rejected: list[str] = field(default_factory=list)  # why each other layout is left out

    def ranked(self) -> list[Candidate]:
        """Fastest first; of equal speed, the least memory first."""
        return sorted(self.feasible, key=lambda c: (-c.tokens_per_s, c.memory["total"]))


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tensor_parallel_problem(m: ModelConfig, ffn: int, tensor: int) -> str | None:
    """Why `tensor` ranks cannot split the heads, query groups or the MLP of width `ffn`."""
    groups = m.num_query_groups or m.num_attention_heads
    if m.num_attention_heads % tensor:
        return f"TP={tensor} does not divide {m.num_attention_heads} heads"
    if groups % tensor:
        return f"TP={tensor} does not divide {groups} query groups"
    if ffn % tensor:
        return f"TP={tensor} does not divide ffn_hidden_size {ffn}"
    return None


def expert_parallel_sizes(
    m: ModelConfig,
    expert_ffn: int,
    tensor: int,
    data: int,
    context: int,
    expert_tensor: int | None,
    c: Constraints,
    rejected: list[str],
) -> list[int]:
    """EP sizes open to a MoE model at (TP, DP, CP): dividing the experts, and with the experts'
    tensor parallelism dividing TP x CP x DP (megatron-core: TP x CP x DP = expert-TP x EP x
    expert-DP), each expert's MLP of width `expert_ffn`; [1] for a dense model."""
    if not m.moe.experts:
        return [1]
    etp = expert_tensor or tensor
    if expert_ffn % etp:
        rejected.append(f"expert TP={etp} does not divide the experts' FFN")
        return []
    ranks = tensor * context * data
    sizes = [
        ep
        for ep in c.experts or divisors(m.moe.experts)
        if m.moe.experts % ep == 0 and ranks % (etp * ep) == 0
    ]
    if not sizes:
        rejected.append(
            f"TP={tensor} DP={data}: no EP divides {m.moe.experts} experts and the ranks"
        )
    return sizes


def pipeline_problem(m: ModelConfig, pipeline: int, split: PipelineSplit = EVEN) -> str | None:
    """Why `pipeline` stages cannot share out the layers (and the embedding and loss, where
    `split` counts them as layers)."""
    units = split.units(m.num_layers)
    if units % pipeline:
        return f"PP={pipeline} does not divide {units} layers"
    return None


def virtual_stages(
    m: ModelConfig, pipeline: int, grad_accum: int, split: PipelineSplit = EVEN
) -> list[int | None]:
    """Virtual pipeline stages worth trying: none, and up to 8 that split each stage's layers
    evenly where the interleaved schedule can run (micro-batches a multiple of the stages)."""
    if pipeline == 1 or grad_accum % pipeline:
        return [None]
    per_stage = split.units(m.num_layers) // pipeline
    return [None] + [v for v in range(2, 9) if per_stage % v == 0]


def base_layout(cfg: PipelineConfig) -> ParallelLayout:
    """What a search keeps from the config: precision, recompute depth, optimizer and overlap
    settings, on GPUs."""
    p, t = cfg.parallel, cfg.train
    return ParallelLayout(
        expert_tensor=p.expert_tensor,
        recompute_layers=t.recompute_layers,
        pipeline_split=PipelineSplit.of(p),
        context=p.context,
        distributed_optimizer=p.distributed_optimizer,
        overlap_grad_reduce=p.overlap_grad_reduce,
        overlap_param_gather=p.overlap_param_gather and p.distributed_optimizer,
        tp_comm_overlap=p.tp_comm_overlap,
        bucket_params=p.ddp_bucket_size,
        precision=t.precision,
        fused_kernels=True,
    )


def parallel_sizes(
    m: ModelConfig,
    ffn: int,
    gpus: int,
    c: Constraints,
    rejected: list[str] | None = None,
    split: PipelineSplit = EVEN,
) -> Iterator[tuple[int, int]]:
    """The (TP, PP) pairs open for `gpus` GPUs (those of one context-parallel rank) to model `m`
    with an MLP of width `ffn`, in order,
    the pipeline stages sharing out the layers as `split` counts them; why each size is left
    out goes into `rejected` as the pairs are reached."""
    rejected = [] if rejected is None else rejected
    for tensor in c.tensors or divisors(gpus):
        if gpus % tensor or (c.max_tensor is not None and tensor > c.max_tensor):
            continue
        problem = tensor_parallel_problem(m, ffn, tensor)
        if problem:
            rejected.append(problem)
            continue
        for pipeline in divisors(gpus // tensor):
            if c.pipelines is not None and pipeline not in c.pipelines:
                continue
            stages = 1 if c.search_virtual or pipeline == 1 else c.virtual_pipeline or 1
            problem = pipeline_problem(m, pipeline * stages, split)
            if problem:
                if problem not in rejected:  # once, not for every TP
                    rejected.append(problem)
                continue
            yield tensor, pipeline


def search(
    m: ModelConfig,
    vocab: int,
    gpus: int,
    global_batch: int,
    hw: Hardware,
    base: ParallelLayout,
    c: Constraints = Constraints(),
) -> Search:
    """Every layout `c` opens for `gpus` GPUs of `hw` at `global_batch` sequences, from `base`
    (precision, optimizer and overlap settings), each with its memory and speed estimate."""
    found = Search()
    widths = base.model_figures(m, vocab)  # the MLP widths, the same in every layout
    sizes = parallel_sizes(m, widths.ffn_hidden_size, gpus, c, found.rejected, base.pipeline_split)
    for tensor, pipeline in sizes:
        data = gpus // (tensor * pipeline)
        if global_batch % data:
            where = f"TP={tensor} PP={pipeline} DP={data}"
            found.rejected.append(f"{where}: global batch {global_batch} not divisible by DP")
            continue
        per_rank = global_batch // data
        sequence = tensor > 1 if c.sequence_parallel is None else c.sequence_parallel
        micros = c.micro_batches(per_rank) if c.micro_batches else divisors(per_rank)
        experts = expert_parallel_sizes(
            m,
            widths.expert_ffn_hidden_size,
            tensor,
            data,
            base.context,
            base.expert_tensor,
            c,
            found.rejected,
        )
        for expert in experts:
            for micro in micros:
                accum = per_rank // micro
                virtuals = [c.virtual_pipeline if pipeline > 1 else None]
                if c.search_virtual:
                    virtuals = virtual_stages(m, pipeline, accum, base.pipeline_split)
                for virtual in virtuals:
                    for mode in c.recompute:
                        layout = replace(
                            base,
                            tensor=tensor,
                            pipeline=pipeline,
                            virtual_pipeline=virtual,
                            data=data,
                            expert=expert,
                            micro_batch=micro,
                            grad_accum=accum,
                            recompute=mode,
                            sequence_parallel=sequence,
                            tp_comm_overlap=base.tp_comm_overlap and tensor > 1 and sequence,
                        )
                        _consider(m, vocab, layout, hw, c.capacity, found)
    return found


# A layout's figures, made once per process: the plan made at launch (run_plan) reads those the
# auto values' search made for the layout it chose. Pure functions of the key; bounded.
_ESTIMATES: dict[tuple, Candidate] = {}
_ESTIMATES_KEPT = 50_000


def estimate(m: ModelConfig, vocab: int, layout: ParallelLayout, hw: Hardware) -> Candidate:
    """The layout's memory breakdown and expected step on `hw`, and the model's figures they
    read, made once."""
    key = (repr(m), vocab, layout, hw)  # a model config is mutable, so not hashable itself
    if key not in _ESTIMATES:
        if len(_ESTIMATES) >= _ESTIMATES_KEPT:
            del _ESTIMATES[next(iter(_ESTIMATES))]  # the oldest
        figures = layout.model_figures(m, vocab)
        memory = MappingProxyType(memory_per_gpu(m, figures, layout))
        step = MappingProxyType(expected_step(m, figures, layout, hw))
        _ESTIMATES[key] = Candidate(layout, memory, step, figures)
    return _ESTIMATES[key]


def _consider(
    m: ModelConfig,
    vocab: int,
    layout: ParallelLayout,
    hw: Hardware,
    capacity: int | None,
    found: Search,
) -> None:
    candidate = estimate(m, vocab, layout, hw)
    memory = candidate.memory
    if capacity is not None and memory["total"] > capacity:
        vp = f" vp={layout.virtual_pipeline}" if layout.virtual_pipeline else ""
        ep = f" EP={layout.expert}" if layout.expert > 1 else ""
        found.rejected.append(
            f"TP={layout.tensor} PP={layout.pipeline}{vp} DP={layout.data}{ep} "
            f"mbs={layout.micro_batch} recompute={layout.recompute}: needs "
            f"{memory['total'] / GIB:.1f} GiB > {capacity / GIB:.1f} GiB"
        )
        return
    found.feasible.append(candidate)


def search_layouts(
    cfg: PipelineConfig,
    vocab_size: int,
    gpus: int,
    gpu_memory_gb: float,
    gpus_per_node: int = 8,
    hw: Hardware | None = None,
    capacity: int | None = None,
) -> Search:
    """Everything the search opens for the config's model on `gpus` GPUs of `gpu_memory_gb`
    (`python -m pipeline.plan --search`, and the layout the preflight suggests): those that fit,
    fastest first by `expected_step` on `hw` (the preset of the GPU of that memory, with
    `gpus_per_node` to an NVLink domain, when None), and a reason for each that does not.
    `capacity`: the bytes a GPU holds when known exactly."""
    capacity = capacity or capacity_bytes(gpu_memory_gb)
    if hw is None:
        hw = hardware.preset(GPU_BY_MEMORY.get(int(gpu_memory_gb), "H100"))
        if hw.nvlink_domain <= hardware.NODE:
            hw = replace(hw, nvlink_domain=gpus_per_node)
    found = search(
        cfg.model,
        vocab_size,
        gpus,
        cfg.train.global_batch_size,
        hw,
        base_layout(cfg),
        Constraints(capacity=capacity),
    )
    found.feasible = found.ranked()
    return found
