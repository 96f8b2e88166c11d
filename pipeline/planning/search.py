"""The parallel layouts of a model on N GPUs: every (TP, PP, DP, micro-batch, accumulation,
recompute) that fits the GPUs' memory, fastest first by the throughput estimate, and why each
other one does not fit."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from pipeline.config import ModelConfig, PipelineConfig
from pipeline.config.choices import RECOMPUTE_MODES
from pipeline.model.sizes import ffn_hidden_size
from pipeline.model.stages import EVEN, PipelineSplit
from pipeline.planning import hardware
from pipeline.planning.hardware import Hardware
from pipeline.planning.memory import memory_per_gpu
from pipeline.planning.parallel_layout import ParallelLayout
from pipeline.planning.throughput import expected_step
from pipeline.planning.units import GIB
from pipeline.runtime.gpus import GPU_BY_MEMORY, capacity_bytes


@dataclass(frozen=True)
class Candidate:
    layout: ParallelLayout
    memory: dict[str, int]
    throughput: dict[str, float]


@dataclass
class Search:
    feasible: list[Candidate] = field(default_factory=list)  # best first
    rejected: list[str] = field(default_factory=list)  # why each other layout does not fit


def divisors(n: int) -> list[int]:
    """The sizes a parallel dimension of n GPUs, or a batch of n sequences, splits into."""
    return [d for d in range(1, n + 1) if n % d == 0]


def tensor_parallel_problem(m: ModelConfig, tensor: int) -> str | None:
    groups = m.num_query_groups or m.num_attention_heads
    if m.num_attention_heads % tensor:
        return f"TP={tensor} does not divide {m.num_attention_heads} heads"
    if groups % tensor:
        return f"TP={tensor} does not divide {groups} query groups"
    if ffn_hidden_size(m) % tensor:
        return f"TP={tensor} does not divide ffn_hidden_size {ffn_hidden_size(m)}"
    return None


def pipeline_problem(m: ModelConfig, pipeline: int, split: PipelineSplit = EVEN) -> str | None:
    """Why `pipeline` stages cannot share out the layers (and the embedding and loss, where
    `split` counts them as layers)."""
    units = split.units(m.num_layers)
    if units % pipeline:
        return f"PP={pipeline} does not divide {units} layers"
    return None


def _base_layout(cfg: PipelineConfig) -> ParallelLayout:
    """What the search keeps from the config: precision, optimizer and overlap settings."""
    p, t = cfg.parallel, cfg.train
    return ParallelLayout(
        pipeline_split=PipelineSplit.of(p),
        distributed_optimizer=p.distributed_optimizer,
        overlap_grad_reduce=p.overlap_grad_reduce,
        overlap_param_gather=p.overlap_param_gather and p.distributed_optimizer,
        tp_comm_overlap=p.tp_comm_overlap,
        bucket_params=p.ddp_bucket_size,
        precision=t.precision,
        fused_kernels=True,
    )


def virtual_stages(
    m: ModelConfig, pipeline: int, grad_accum: int, split: PipelineSplit = EVEN
) -> list[int | None]:
    """Virtual pipeline stages worth trying: none, and up to 8 that split each stage's layers
    evenly where the interleaved schedule can run (micro-batches a multiple of the stages)."""
    if pipeline == 1 or grad_accum % pipeline:
        return [None]
    per_stage = split.units(m.num_layers) // pipeline
    return [None] + [v for v in range(2, 9) if per_stage % v == 0]


def search_layouts(
    cfg: PipelineConfig,
    vocab_size: int,
    gpus: int,
    gpu_memory_gb: float,
    gpus_per_node: int = 8,
    hw: Hardware | None = None,
    capacity: int | None = None,
) -> Search:
    """Every (TP, PP, virtual stages, DP, micro-batch, accumulation, recompute) for `gpus` GPUs
    of `gpu_memory_gb` at the config's sequence length and global batch: those that fit,
    fastest first by `expected_step` on `hw` (the preset of the GPU of that memory, with
    `gpus_per_node` to an NVLink domain, when None), and a reason for each that does not.
    `capacity`: the bytes a GPU holds when known exactly (a GPU found on this machine).
    Sequence parallelism is on whenever TP > 1 (less memory, the same traffic)."""
    capacity = capacity or capacity_bytes(gpu_memory_gb)
    if hw is None:
        hw = hardware.preset(GPU_BY_MEMORY.get(int(gpu_memory_gb), "H100"))
        if hw.nvlink_domain <= hardware.NODE:
            hw = replace(hw, nvlink_domain=gpus_per_node)
    global_batch = cfg.train.global_batch_size
    base = _base_layout(cfg)
    found = Search()
    for tensor in divisors(gpus):
        problem = tensor_parallel_problem(cfg.model, tensor)
        if problem:
            found.rejected.append(problem)
            continue
        for pipeline in divisors(gpus // tensor):
            problem = pipeline_problem(cfg.model, pipeline, base.pipeline_split)
            if problem:
                if problem not in found.rejected:  # once, not for every TP
                    found.rejected.append(problem)
                continue
            data = gpus // (tensor * pipeline)
            where = f"TP={tensor} PP={pipeline} DP={data}"
            if global_batch % data:
                found.rejected.append(f"{where}: global batch {global_batch} not divisible by DP")
                continue
            for micro in divisors(global_batch // data):
                accum = global_batch // (data * micro)
                for virtual in virtual_stages(cfg.model, pipeline, accum, base.pipeline_split):
                    for recompute in RECOMPUTE_MODES:
                        layout = replace(
                            base,
                            tensor=tensor,
                            pipeline=pipeline,
                            virtual_pipeline=virtual,
                            data=data,
                            micro_batch=micro,
                            grad_accum=accum,
                            recompute=recompute,
                            sequence_parallel=tensor > 1,
                            tp_comm_overlap=base.tp_comm_overlap and tensor > 1,
                        )
                        _consider(cfg, vocab_size, layout, capacity, hw, found)
    found.feasible.sort(key=lambda c: (-c.throughput["tokens_per_s_per_gpu"], c.memory["total"]))
    return found


def _consider(
    cfg: PipelineConfig,
    vocab_size: int,
    layout: ParallelLayout,
    capacity: int,
    hw: Hardware,
    found: Search,
) -> None:
    memory = memory_per_gpu(cfg.model, vocab_size, layout)
    if memory["total"] > capacity:
        vp = f" vp={layout.virtual_pipeline}" if layout.virtual_pipeline else ""
        found.rejected.append(
            f"TP={layout.tensor} PP={layout.pipeline}{vp} DP={layout.data} "
            f"mbs={layout.micro_batch} recompute={layout.recompute}: needs "
            f"{memory['total'] / GIB:.1f} GiB > {capacity / GIB:.1f} GiB"
        )
        return
    speed = expected_step(cfg.model, vocab_size, layout, hw)
    found.feasible.append(Candidate(layout, memory, speed))
