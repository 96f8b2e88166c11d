"""The planner's MoE parameter counts against a megatron-core MoE model built on CPU (the local
layer spec, the allgather dispatcher): router, experts, shared expert and dense first layers,
as megatron-core 0.16.1 makes them."""

from __future__ import annotations

import pytest
import torch

from pipeline.config.sections.model import MoeConfig
from pipeline.model.parameters import parameter_count, stage_params
from pipeline.planning.calibration import PublishedModel
from pipeline.runtime import distributed


@pytest.fixture(scope="module")
def model_parallel():
    from megatron.core import parallel_state

    distributed.init("gloo")
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


@pytest.mark.parametrize("shared,dense_first", [(0, 0), (96, 1)])
def test_moe_parameters_are_those_megatron_core_builds(model_parallel, shared, dense_first):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.moe import moe_utils

    moe_utils.te_general_gemm = None  # undefined without Transformer Engine (issue 42)
    layers, experts = 3, 8
    cfg = TransformerConfig(
        num_layers=layers,
        hidden_size=64,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=160,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        normalization="RMSNorm",
        add_bias_linear=False,
        num_moe_experts=experts,
        moe_router_topk=2,
        moe_ffn_hidden_size=48,
        moe_shared_expert_intermediate_size=shared or None,
        moe_layer_freq=[0] * dense_first + [1] * (layers - dense_first),
        moe_token_dispatcher_type="allgather",
        use_cpu_initialization=True,
    )
    model = GPTModel(
        config=cfg,
        transformer_layer_spec=get_gpt_decoder_block_spec(cfg, use_transformer_engine=False),
        vocab_size=256,
        max_sequence_length=32,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,
    )
    built = sum(p.numel() for p in model.parameters())
    expert_params = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    m = PublishedModel(
        name="moe-small",
        num_layers=layers,
        hidden_size=64,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=160,
        seq_length=32,
        moe=MoeConfig(
            experts=experts,
            top_k=2,
            ffn_hidden_size=48,
            shared_expert_ffn_hidden_size=shared,
            first_dense_layers=dense_first,
        ),
    )
    assert parameter_count(m, 256)["total"] == built
    one_gpu = stage_params(m, 256, 1, 1, 0)
    assert (one_gpu["total"], one_gpu["experts"]) == (built, expert_params)
