"""The fastest layout of a model on N GPUs by the throughput model, and what limits it: the
search behind `python -m pipeline.plan --validate`'s planner column and tools/scaling_table.py
(docs/scaling.md). Precision and overlap settings come from a base layout; the search opens
TP (inside the NVLink domain, at most 8), PP (dividing the layers), virtual stages,
micro-batch and recompute, and keeps those whose memory estimate fits the GPU."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeline.config import ModelConfig
from pipeline.config.choices import RECOMPUTE_MODES
from pipeline.planning.hardware import Hardware
from pipeline.planning.memory import memory_per_gpu
from pipeline.planning.parallel_layout import ParallelLayout
from pipeline.planning.search import (
    divisors,
    pipeline_problem,
    tensor_parallel_problem,
    virtual_stages,
)
from pipeline.planning.throughput import expected_step

MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Choice:
    layout: ParallelLayout
    estimate: dict[str, float]
    memory: int  # bytes on the busiest GPU


def layouts(m: ModelConfig, gpus: int, global_batch: int, hw: Hardware, base: ParallelLayout):
    """Every layout the search opens for `gpus` GPUs at `global_batch` sequences."""
    tensors = [t for t in (1, 2, 4, 8) if gpus % t == 0 and t <= max(hw.nvlink_domain, 1)]
    for tensor in (t for t in tensors if tensor_parallel_problem(m, t) is None):
        for pipeline in divisors(gpus // tensor):
            if pipeline_problem(m, pipeline):
                continue
            data = gpus // (tensor * pipeline)
            if global_batch % data:
                continue
            per_rank = global_batch // data
            for micro in (mb for mb in MICRO_BATCHES if per_rank % mb == 0):
                for virtual in virtual_stages(m, pipeline, per_rank // micro):
                    for mode in RECOMPUTE_MODES:
                        yield replace(
                            base,
                            tensor=tensor,
                            pipeline=pipeline,
                            data=data,
                            context=1,
                            micro_batch=micro,
                            grad_accum=per_rank // micro,
                            virtual_pipeline=virtual,
                            recompute=mode,
                            sequence_parallel=tensor > 1,
                            tp_comm_overlap=base.tp_comm_overlap and tensor > 1,
                        )


def best_layout(
    m: ModelConfig,
    vocab: int,
    gpus: int,
    global_batch: int,
    hw: Hardware,
    capacity: int,
    base: ParallelLayout | None = None,
) -> Choice | None:
    """The layout of the most tokens/s per GPU whose memory estimate fits `capacity` bytes."""
    base = base or ParallelLayout(overlap_grad_reduce=True, overlap_param_gather=True)
    best = None
    for layout in layouts(m, gpus, global_batch, hw, base):
        memory = memory_per_gpu(m, vocab, layout)["total"]
        if memory > capacity:
            continue
        estimate = expected_step(m, vocab, layout, hw)
        if best is None or estimate["tokens_per_s_per_gpu"] > best.estimate["tokens_per_s_per_gpu"]:
            best = Choice(layout, estimate, memory)
    return best


def limit(choice: Choice, hw: Hardware) -> str:
    """What costs this point the most beyond compute: the bubble, TP (across NVLink domains),
    data-parallel traffic (bandwidth and per-bucket latency), or nothing much."""
    e, lo = choice.estimate, choice.layout
    costs = {
        "pipeline bubble": e["bubble_s"],
        "TP across NVLink domains" if lo.tensor > hw.nvlink_domain else "TP traffic": e[
            "tp_comm_s"
        ],
        "DP traffic": e["dp_comm_s"],
        "optimizer": e["optimizer_s"],
    }
    name, seconds = max(costs.items(), key=lambda item: item[1])
    share = seconds / e["step_s"]
    if share >= 0.02:
        return f"{name} {share:.0%}"
    return f"compute (micro-batch {lo.micro_batch})"
