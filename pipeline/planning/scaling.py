"""The fastest layout of a model on N GPUs by the throughput model, and what limits it, for
`python -m pipeline.plan --validate`'s planner column and tools/scaling_table.py
(docs/scaling.md), by the one layout search (pipeline.planning.search). Precision and overlap settings come from a
base layout; the search opens TP (1, 2, 4 or 8, inside the NVLink domain), PP (dividing the
layers), virtual stages, micro-batches of MICRO_BATCHES and recompute, and keeps those whose
memory estimate fits the GPU."""

from __future__ import annotations

from pipeline.config import ModelConfig
from pipeline.planning.hardware import Hardware
from pipeline.planning.parallel_layout import ParallelLayout
from pipeline.planning.search import Candidate, Constraints, search

MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64)
TENSORS = (1, 2, 4, 8)


def constraints(hw: Hardware, capacity: int) -> Constraints:
    """What these tables open: TP of 1, 2, 4 or 8 inside the NVLink domain, the micro-batches
    of MICRO_BATCHES, and only layouts whose memory estimate fits `capacity` bytes."""
    return Constraints(
        tensors=TENSORS,
        max_tensor=max(hw.nvlink_domain, 1),
        micro_batches=lambda per_rank: [mb for mb in MICRO_BATCHES if per_rank % mb == 0],
        capacity=capacity,
    )


def best_layout(
    m: ModelConfig,
    vocab: int,
    gpus: int,
    global_batch: int,
    hw: Hardware,
    capacity: int,
    base: ParallelLayout | None = None,
) -> Candidate | None:
    """The layout of the most tokens/s per GPU whose memory estimate fits `capacity` bytes
    (the first searched of equal speed)."""
    base = base or ParallelLayout(overlap_grad_reduce=True, overlap_param_gather=True)
    found = search(m, vocab, gpus, global_batch, hw, base, constraints(hw, capacity))
    return max(found.feasible, key=lambda c: c.tokens_per_s, default=None)


def limit(choice: Candidate, hw: Hardware) -> str:
    """What costs this point the most beyond compute: the bubble, TP (across NVLink domains),
    data-parallel traffic (bandwidth and per-bucket latency), the MoE dispatcher's
    all-to-alls, or nothing much."""
    e, lo = choice.throughput, choice.layout
    costs = {
        "pipeline bubble": e["bubble_s"],
        "TP across NVLink domains" if lo.tensor > hw.nvlink_domain else "TP traffic": e[
            "tp_comm_s"
        ],
        "DP traffic": e["dp_comm_s"],
        "all-to-all": e["ep_comm_s"],
        "optimizer": e["optimizer_s"],
    }
    name, seconds = max(costs.items(), key=lambda item: item[1])
    share = seconds / e["step_s"]
    if share >= 0.02:
        return f"{name} {share:.0%}"
    return f"compute (micro-batch {lo.micro_batch})"
