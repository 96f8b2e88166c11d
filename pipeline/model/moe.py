"""Mixture of experts (model.moe.experts > 0): megatron-core 0.16.1's MoE layer as the config
asks for it.

Every backend shares these fields; the backend adds how tokens travel (the allgather dispatcher
on the CPU, alltoall with Transformer Engine's grouped GEMM and fused kernels on GPUs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.config import ModelConfig, PipelineConfig
from pipeline.model.sizes import ffn_hidden_size
from pipeline.runtime import distributed

if TYPE_CHECKING:
    import torch

# DeepSeek-V3's bias step for aux-loss-free balancing (megatron-core's default too)
EXPERT_BIAS_UPDATE_RATE = 1e-3


def is_moe(m: ModelConfig) -> bool:
    return m.moe.experts > 0


def moe_layer_pattern(m: ModelConfig) -> list[int]:
    """megatron-core's moe_layer_freq as a list: 0 for each of the first dense layers, 1 after."""
    dense = m.moe.first_dense_layers
    return [0 if i < dense else 1 for i in range(m.num_layers)]


def transformer_options(cfg: PipelineConfig) -> dict[str, Any]:
    """TransformerConfig's MoE fields; {} for a dense model."""
    m, p = cfg.model, cfg.parallel
    if not is_moe(m):
        return {}
    moe = m.moe
    aux_loss_free = moe.router == "aux_loss_free"
    return dict(
        num_moe_experts=moe.experts,
        moe_router_topk=moe.top_k,
        moe_ffn_hidden_size=moe.ffn_hidden_size or ffn_hidden_size(m),
        moe_shared_expert_intermediate_size=moe.shared_expert_ffn_hidden_size or None,
        # aux-loss-free: no loss, a bias per expert raised or lowered against its load, which
        # megatron-core applies to sigmoid scores only (DeepSeek-V3)
        moe_router_load_balancing_type="none" if aux_loss_free else str(moe.router),
        moe_router_enable_expert_bias=aux_loss_free,
        moe_router_score_function="sigmoid" if aux_loss_free else "softmax",
        moe_router_bias_update_rate=EXPERT_BIAS_UPDATE_RATE,
        moe_aux_loss_coeff=0.0 if aux_loss_free else moe.aux_loss_coeff,
        moe_z_loss_coeff=moe.z_loss_coeff or None,
        # one expert per token: softmax over the one chosen logit has no gradient (Switch
        # takes it over all experts first)
        moe_router_pre_softmax=moe.top_k == 1,
        moe_expert_capacity_factor=moe.capacity_factor,
        moe_token_drop_policy="probs",
        moe_layer_freq=moe_layer_pattern(m),
        expert_model_parallel_size=p.expert,
        expert_tensor_parallel_size=p.expert_tensor,
    )


def use_torch_router_gemm() -> None:
    """megatron-core 0.16.1 names Transformer Engine's GEMM in the router whether or not TE
    was importable (moe_utils.te_general_gemm is then undefined); None sends it to torch.mm."""
    from megatron.core.transformer.moe import moe_utils

    if not moe_utils.HAVE_TE:
        moe_utils.te_general_gemm = None


def routers(chunks: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """Every MoE layer's router in this rank's model chunks, in layer order."""
    from megatron.core.transformer.moe.router import TopKRouter

    return [m for chunk in chunks for m in chunk.modules() if isinstance(m, TopKRouter)]


def update_expert_bias(chunks: list[torch.nn.Module]) -> None:
    """Aux-loss-free balancing after a step's backward passes, as megatron-core's
    finalize_model_grads does it for its own optimizer: each expert's bias moves against its
    load over the whole job, and the counts start again."""
    import torch
    from megatron.core.transformer.moe.moe_utils import get_updated_expert_bias

    biased = [r for r in routers(chunks) if r.expert_bias is not None]
    if not biased:
        return
    counts = torch.stack([r.local_tokens_per_expert for r in biased])
    biases = torch.stack([r.expert_bias for r in biased])
    updated = get_updated_expert_bias(counts, biases, EXPERT_BIAS_UPDATE_RATE)  # all-reduces
    for router, bias in zip(biased, updated, strict=True):
        router.expert_bias.copy_(bias)
        router.local_tokens_per_expert.zero_()


def layer_specs(cfg: PipelineConfig, config: Any, dense: Any, expert: Any, vp_stage: int | None):
    """The layer specs of the layers this pipeline stage builds: `expert` (a MoE layer) where
    model.moe.first_dense_layers leaves one, `dense` elsewhere."""
    from megatron.core import parallel_state
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    count = get_num_layers_to_build(config, vp_stage=vp_stage)
    if not is_moe(cfg.model):
        return [dense] * count
    rank = parallel_state.get_pipeline_model_parallel_rank()
    offset = get_transformer_layer_offset(config, vp_stage, rank)
    pattern = moe_layer_pattern(cfg.model)
    return [expert if pattern[offset + i] else dense for i in range(count)]


def parameter_counts(chunks: list[torch.nn.Module], m: ModelConfig) -> tuple[int, int]:
    """(total, active) parameters of the whole model, counted from the built chunks of every
    rank (a collective: every rank calls it). Active: what one token passes through, each MoE
    layer's routed experts counted at top_k/experts; the router, a shared expert and
    everything else whole."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    dense = experts = 0
    for chunk in chunks:
        for name, p in chunk.named_parameters():
            if ".mlp.experts." in name:  # routed experts (a shared expert is mlp.shared_experts)
                experts += p.numel()  # every expert-tensor shard; copies divided out below
            elif param_is_not_tensor_parallel_duplicate(p):
                dense += p.numel()
    counts = distributed.sum_over_job(torch.tensor([dense, experts], dtype=torch.float64))
    if torch.distributed.is_initialized():
        # each dense weight is held by every data- (and context-) parallel rank, each expert
        # shard by every rank of its expert-data-parallel group
        copies = [
            ps.get_data_parallel_world_size(with_context_parallel=True),
            ps.get_expert_data_parallel_world_size(),
        ]
        counts = counts / torch.tensor(copies, dtype=torch.float64)
    dense, experts = (round(float(x)) for x in counts)
    share = m.moe.top_k / m.moe.experts if is_moe(m) else 1.0
    return dense + experts, dense + round(experts * share)
