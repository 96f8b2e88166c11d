"""How evenly a mixture of experts' routers share tokens out, per log interval: for each MoE
layer, the busiest expert's tokens over the mean (1.0: even), the experts that received no
token, the share of token-to-expert assignments dropped for want of capacity, and the
router's auxiliary losses as megatron-core tracks them (each loss before its weight).

Routing has collapsed in a layer when its busiest expert takes more than COLLAPSE_RATIO times
its even share (or, where top_k leaves less room, 90% of the most it can take: every token's
top_k experts are distinct, so one expert takes at most experts/top_k times the mean), or when
half the experts or more receive nothing over the interval. The trainer says so in one line
naming the layer; status and the report show it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.config import ModelConfig, PipelineConfig
from pipeline.config.derived import sequence_parallel, settled
from pipeline.model import moe
from pipeline.runtime import distributed

if TYPE_CHECKING:
    import torch

COLLAPSE_RATIO = 4.0
# megatron-core's names in its layer-wise tracker, and ours in the metrics
AUX_LOSSES = {
    "load_balancing_loss": "moe/aux_loss",
    "seq_load_balancing_loss": "moe/seq_aux_loss",
    "z_loss": "moe/z_loss",
}


@dataclass(frozen=True)
class LayerLoad:
    layer: int  # megatron-core's layer number, from 1
    tokens: list[float]  # per expert, over the interval and the whole job
    assigned: float  # token-to-expert assignments the router made (tokens x top_k)

    @property
    def max_over_mean(self) -> float:
        mean = sum(self.tokens) / len(self.tokens)
        return max(self.tokens) / mean if mean else 0.0

    @property
    def idle_experts(self) -> int:
        return sum(1 for t in self.tokens if t == 0)

    @property
    def dropped(self) -> float:
        return 1 - sum(self.tokens) / self.assigned if self.assigned else 0.0


def collapse_ratio(experts: int, top_k: int) -> float:
    """The max-over-mean load above which a layer's routing counts as collapsed."""
    return min(COLLAPSE_RATIO, 0.9 * experts / top_k)


def collapse(load: LayerLoad, top_k: int) -> str | None:
    """What is wrong with the layer's routing, in a few words; None: healthy."""
    experts = len(load.tokens)
    if load.assigned and load.idle_experts * 2 >= experts:
        return f"{load.idle_experts} of {experts} experts received no token"
    if load.max_over_mean > collapse_ratio(experts, top_k):
        busiest = max(range(experts), key=lambda e: load.tokens[e])
        return f"expert {busiest} took {load.max_over_mean:.1f}x its even share"
    return None


def warning_line(step: int, layer: int, problem: str, m: ModelConfig) -> str:
    """The one line the log gets for a layer whose routing collapsed."""
    limit = collapse_ratio(m.moe.experts, m.moe.top_k)
    remedy = (
        "raise model.moe.aux_loss_coeff or lower train.lr"
        if m.moe.router != "aux_loss_free"
        else "lower train.lr or use model.moe.router=aux_loss"
    )
    return (
        f"warning: step {step}: routing collapsed in MoE layer {layer}: {problem} (collapse: "
        f"the busiest expert over {limit:.1f}x its even share, or half the experts idle); "
        f"{remedy}"
    )


class RouterHealth:
    """Counts, on every rank, the tokens each router sends to each expert in training forward
    passes (forward hooks), and sums them over the job at each log interval."""

    def __init__(self, chunks: list[torch.nn.Module], cfg: PipelineConfig) -> None:
        import torch

        self.cfg = cfg
        self.routers = moe.routers(chunks)
        m = cfg.model
        self.layers, self.experts, self.top_k = m.num_layers, m.moe.experts, m.moe.top_k
        # on the device the routers run on, moved at log intervals alone: never a GPU sync
        # in the forward pass
        device = next((p.device for r in self.routers for p in r.parameters()), None)
        shape = (self.layers, self.experts + 1)
        self.counts = torch.zeros(shape, dtype=torch.float64, device=device or "cpu")
        for router in self.routers:
            router.register_forward_hook(self._count)
        from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

        # megatron-core sizes its per-layer loss tracker (process-wide) for the first model that
        # fills it: one built before in this process (another layer count) is forgotten
        get_moe_layer_wise_logging_tracker().clear()
        # tensor-parallel ranks without sequence parallelism route the same tokens
        s = settled(cfg)
        self.copies = 1 if sequence_parallel(cfg) else s.tensor

    @classmethod
    def of(cls, chunks: list[torch.nn.Module], cfg: PipelineConfig) -> RouterHealth | None:
        return cls(chunks, cfg) if moe.is_moe(cfg.model) else None

    def _count(self, router: torch.nn.Module, inputs, output) -> None:
        import torch

        # training passes only; under full recompute the forward without gradients is not
        # counted and its recomputation is: each micro-batch once
        if not (router.training and torch.is_grad_enabled()):
            return
        _, routing_map = output
        row = self.counts[router.layer_number - 1]
        row[:-1] += routing_map.sum(dim=0).to(row.device, row.dtype)
        row[-1] += routing_map.shape[0] * self.top_k

    def interval(self, micro_batches: int) -> tuple[dict, list[LayerLoad]]:
        """The metrics of the interval since the last call, in which each rank ran
        `micro_batches` training forward passes (every rank calls it: it all-reduces), and each
        MoE layer's load."""
        import torch
        from megatron.core.transformer.moe.moe_utils import (
            clear_aux_losses_tracker,
            get_moe_layer_wise_logging_tracker,
        )

        tracker = get_moe_layer_wise_logging_tracker()
        losses = torch.zeros(len(AUX_LOSSES), self.layers, dtype=torch.float64)
        for i, name in enumerate(AUX_LOSSES):
            if name in tracker:
                losses[i] = tracker[name]["values"].detach().to("cpu", torch.float64)
        clear_aux_losses_tracker()
        # one all-reduce of everything: counts sum over the ranks routing different tokens;
        # the losses (each rank's mean over its micro-batches) average over the ranks holding
        # the layer, every rank of its pipeline stage
        counts = self.counts.to("cpu", torch.float64)
        packed = torch.cat([counts.flatten(), losses.flatten() / max(micro_batches, 1)])
        holders = torch.zeros(self.layers, dtype=torch.float64)
        holders[[r.layer_number - 1 for r in self.routers]] = 1.0
        packed = torch.cat([packed, holders])
        packed = distributed.sum_over_job(packed)
        cut = counts.numel()
        counts = packed[:cut].view(self.layers, -1) / self.copies
        losses = packed[cut : cut + losses.numel()].view(len(AUX_LOSSES), self.layers)
        holders = packed[cut + losses.numel() :]
        self.counts.zero_()
        moe_layers = [i for i in range(self.layers) if holders[i] > 0]
        loads = [
            LayerLoad(i + 1, counts[i, :-1].tolist(), float(counts[i, -1])) for i in moe_layers
        ]
        record: dict = {}
        for i, key in enumerate(AUX_LOSSES.values()):
            per_layer = [float(losses[i, j] / holders[j]) for j in moe_layers]
            if any(per_layer):
                record[key] = sum(per_layer) / len(per_layer)
        if loads:
            record["moe/max_over_mean"] = max(load.max_over_mean for load in loads)
            record["moe/idle_experts"] = max(load.idle_experts for load in loads)
            assigned = sum(load.assigned for load in loads)
            kept = sum(sum(load.tokens) for load in loads)
            record["moe/dropped"] = 1 - kept / assigned if assigned else 0.0
            # per layer, for status and the report (its plot: each expert's share over steps)
            record["moe_layers"] = {
                str(load.layer): {
                    "max_over_mean": load.max_over_mean,
                    "idle_experts": load.idle_experts,
                    "dropped": load.dropped,
                    "share": [t / max(sum(load.tokens), 1) for t in load.tokens],
                }
                for load in loads
            }
            problems = {str(load.layer): collapse(load, self.top_k) for load in loads}
            collapsed = {layer: p for layer, p in problems.items() if p}
            if collapsed:
                record["moe_collapse"] = collapsed
        return record, loads
