"""The parallel layouts of a model on N GPUs: every (TP, PP, DP, micro-batch, accumulation,
recompute) that fits the GPUs' memory, fastest first by the throughput estimate, and why each
other one does not fit."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from pipeline.config import ModelConfig, PipelineConfig
from pipeline.model.sizes import ffn_hidden_size
from pipeline.planning.memory import memory_per_gpu
from pipeline.planning.parallel_layout import ParallelLayout
from pipeline.planning.throughput import DEFAULT_MFU, expected_step
from pipeline.planning.units import GIB
from pipeline.runtime.gpus import GPU_BY_MEMORY, capacity_bytes, peak_tflops

RECOMPUTE_MODES = ("none", "selective", "full")


@dataclass(frozen=True)
class Candidate:
    layout: ParallelLayout
    memory: dict[str, int]
    throughput: dict[str, float]


@dataclass
class Search:
    feasible: list[Candidate] = field(default_factory=list)  # best first
    rejected: list[str] = field(default_factory=list)  # why each other layout does not fit


def _divisors(n: int) -> list[int]:
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


def pipeline_problem(m: ModelConfig, pipeline: int) -> str | None:
    if m.num_layers % pipeline:
        return f"PP={pipeline} does not divide {m.num_layers} layers"
    return None


def _base_layout(cfg: PipelineConfig) -> ParallelLayout:
    """What the search keeps from the config: precision, optimizer and overlap settings."""
    p, t = cfg.parallel, cfg.train
    return ParallelLayout(
        distributed_optimizer=p.distributed_optimizer,
        overlap_grad_reduce=p.overlap_grad_reduce,
        precision=t.precision,
        fused_kernels=True,
    )


def search_layouts(
    cfg: PipelineConfig,
    vocab_size: int,
    gpus: int,
    gpu_memory_gb: float,
    gpus_per_node: int = 8,
    peak: float | None = None,
    mfu: float = DEFAULT_MFU,
) -> Search:
    """Every (TP, PP, DP, micro-batch, accumulation, recompute) for `gpus` GPUs of
    `gpu_memory_gb` at the config's sequence length and global batch: those that fit, fastest
    first by `expected_step`, and a reason for each that does not. Sequence parallelism is on
    whenever TP > 1 (less memory, the same traffic)."""
    capacity = capacity_bytes(gpu_memory_gb)
    if peak is None:
        peak = peak_tflops(GPU_BY_MEMORY.get(int(gpu_memory_gb), "H100"), cfg.train.precision)
    global_batch = cfg.train.global_batch_size
    base = _base_layout(cfg)
    found = Search()
    for tensor in _divisors(gpus):
        problem = tensor_parallel_problem(cfg.model, tensor)
        if problem:
            found.rejected.append(problem)
            continue
        for pipeline in _divisors(gpus // tensor):
            problem = pipeline_problem(cfg.model, pipeline)
            if problem:
                if problem not in found.rejected:  # once, not for every TP
                    found.rejected.append(problem)
                continue
            data = gpus // (tensor * pipeline)
            where = f"TP={tensor} PP={pipeline} DP={data}"
            if global_batch % data:
                found.rejected.append(f"{where}: global batch {global_batch} not divisible by DP")
                continue
            for micro in _divisors(global_batch // data):
                for recompute in RECOMPUTE_MODES:
                    layout = replace(
                        base,
                        tensor=tensor,
                        pipeline=pipeline,
                        data=data,
                        micro_batch=micro,
                        grad_accum=global_batch // (data * micro),
                        recompute=recompute,
                        sequence_parallel=tensor > 1,
                    )
                    memory = memory_per_gpu(cfg.model, vocab_size, layout)
                    if memory["total"] > capacity:
                        found.rejected.append(
                            f"{where} mbs={micro} recompute={recompute}: needs "
                            f"{memory['total'] / GIB:.1f} GiB > {capacity / GIB:.1f} GiB"
                        )
                        continue
                    speed = expected_step(cfg, vocab_size, layout, gpus_per_node, peak, mfu)
                    found.feasible.append(Candidate(layout, memory, speed))
    found.feasible.sort(key=lambda c: (-c.throughput["tokens_per_s_per_gpu"], c.memory["total"]))
    return found
