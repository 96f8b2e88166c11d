"""The model: megatron-core's GPTModel, built from the config with the backend's layer spec."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline.config import PipelineConfig
from pipeline.config.derived import settled
from pipeline.model import moe
from pipeline.model.sizes import ffn_hidden_size, padded_vocab, params_dtype
from pipeline.model.stages import PipelineSplit
from pipeline.model.vocab_padding import mask_padding

if TYPE_CHECKING:
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from pipeline.model.backends.base import Backend


def activation_function(activation: str) -> Callable:
    """The MLP's activation as megatron-core takes it (SwiGLU: silu with a gated FC1)."""
    import torch.nn.functional as F
    from megatron.core.activations import squared_relu

    return {"swiglu": F.silu, "gelu": F.gelu, "squared_relu": squared_relu}[activation]


def transformer_config(cfg: PipelineConfig, backend: Backend) -> TransformerConfig:
    from megatron.core.transformer.transformer_config import TransformerConfig

    m, p, t, s = cfg.model, cfg.parallel, cfg.train, settled(cfg)
    dtype = params_dtype(t.precision)
    recompute = {}
    if s.recompute == "selective":
        recompute = dict(recompute_granularity="selective")
    elif s.recompute == "full":
        recompute = dict(
            recompute_granularity="full",
            recompute_method="block",
            recompute_num_layers=t.recompute_layers
            or PipelineSplit.of(p).most_layers(m.num_layers, s.pipeline),
        )
    return TransformerConfig(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups or m.num_attention_heads,
        ffn_hidden_size=ffn_hidden_size(m),
        gated_linear_unit=m.activation == "swiglu",
        activation_func=activation_function(m.activation),
        normalization=m.normalization,
        add_bias_linear=m.add_bias_linear,
        init_method_std=m.init_method_std,
        hidden_dropout=m.hidden_dropout,
        attention_dropout=m.attention_dropout,
        tensor_model_parallel_size=s.tensor,
        pipeline_model_parallel_size=s.pipeline,
        virtual_pipeline_model_parallel_size=p.virtual_pipeline,
        account_for_embedding_in_pipeline_split=p.account_for_embedding,
        account_for_loss_in_pipeline_split=p.account_for_loss,
        context_parallel_size=p.context,
        sequence_parallel=p.sequence_parallel,
        bf16=t.precision in ("bf16", "fp8"),
        fp16=t.precision == "fp16",
        params_dtype=dtype,
        pipeline_dtype=dtype,
        # the interleaved schedule's batched send/receive pairs an activation with a gradient
        # when both stages' neighbours are one rank (pipeline 2): silently wrong training
        # (Megatron-LM #750, #1450); separate forward and backward exchanges are right for any
        # pipeline size
        overlap_p2p_comm=bool(p.virtual_pipeline),
        batch_p2p_comm=not p.virtual_pipeline,
        **recompute,
        **moe.transformer_options(cfg),
        **backend.transformer_options(cfg),
    )


def build(
    cfg: PipelineConfig,
    vocab_size: int,
    backend: Backend,
    pre_process: bool = True,
    post_process: bool = True,
    vp_stage: int | None = None,
    padded_vocab_size: int | None = None,
) -> GPTModel:
    """The model over `vocab_size` pieces, its embedding and output layer padded to
    `padded_vocab_size` rows (None: megatron-core's padding for this layout; a checkpoint written
    under another tensor-parallel size keeps its own), the padding never given probability."""
    from megatron.core.models.gpt import GPTModel

    m = cfg.model
    config = transformer_config(cfg, backend)
    padded = padded_vocab_size or padded_vocab(vocab_size, m, settled(cfg).tensor)
    model = GPTModel(
        config=config,
        transformer_layer_spec=backend.layer_spec(cfg, config, vp_stage),
        vocab_size=padded,
        max_sequence_length=m.max_position_embeddings or m.seq_length,
        pre_process=pre_process,
        post_process=post_process,
        share_embeddings_and_output_weights=not m.untie_embeddings,
        position_embedding_type=m.position_embedding,
        rotary_base=m.rotary_base,
        vp_stage=vp_stage,
    )
    if post_process:
        mask_padding(model.output_layer, vocab_size, padded)
    return backend.adapt_model(model)
