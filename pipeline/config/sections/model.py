"""The model's shape (model.*) and how it is split over GPUs (parallel.*)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from pipeline.config import choices as c
from pipeline.config import rules as r
from pipeline.config.choices import AUTO
from pipeline.config.keys import OUTPUT, command, key
from pipeline.config.rules import AT_LEAST_ONE, FRACTION, POSITIVE


@dataclass
class MoeConfig:
    """Mixture of experts: each MLP becomes `experts` MLPs, of which a router picks `top_k`
    per token. experts=0 is a dense model, and then no other key here is read."""

    experts: int = key(0, OUTPUT, "experts per MoE layer; 0: a dense model", rule=r.NOT_NEGATIVE)
    top_k: int = key(2, OUTPUT, "experts each token is sent to", rule=AT_LEAST_ONE)
    ffn_hidden_size: int | None = key(
        None, OUTPUT, "each expert's MLP width; none: model.ffn_hidden_size", rule=AT_LEAST_ONE
    )
    shared_expert_ffn_hidden_size: int = key(
        0,
        OUTPUT,
        "an MLP every token passes through besides its experts; 0: none",
        rule=r.NOT_NEGATIVE,
    )
    router: c.Router = key(c.Router.aux_loss, OUTPUT, "how the experts' load is balanced")
    aux_loss_coeff: float = key(
        1e-2, OUTPUT, "the load-balancing loss's weight", rule=r.NOT_NEGATIVE
    )
    z_loss_coeff: float = key(
        0.0, OUTPUT, "the router z-loss's weight; 0: none", rule=r.NOT_NEGATIVE
    )
    # none: dropless, every token reaches its experts however uneven the load
    capacity_factor: float | None = key(
        None, OUTPUT, "tokens an expert takes, x its even share; none: dropless", rule=POSITIVE
    )
    first_dense_layers: int = key(
        0, OUTPUT, "the first layers keep a dense MLP (DeepSeek-V3: 3)", rule=r.NOT_NEGATIVE
    )


@dataclass
class ModelConfig:
    name: str = key(MISSING, OUTPUT, "the model's name (its config group)")
    num_layers: int = key(MISSING, OUTPUT, "transformer layers", rule=AT_LEAST_ONE, common=True)
    hidden_size: int = key(MISSING, OUTPUT, "the hidden width", rule=AT_LEAST_ONE, common=True)
    num_attention_heads: int = key(
        MISSING, OUTPUT, "attention heads", rule=AT_LEAST_ONE, common=True
    )
    num_query_groups: int | None = key(
        None, OUTPUT, "grouped-query attention; none: multi-head", rule=AT_LEAST_ONE
    )
    ffn_hidden_size: int | None = key(
        None, OUTPUT, "none: 4 x hidden (8/3 x hidden for SwiGLU)", rule=AT_LEAST_ONE
    )
    seq_length: int = key(2048, OUTPUT, "tokens per sequence", rule=AT_LEAST_ONE, common=True)
    max_position_embeddings: int | None = key(
        None, OUTPUT, "none: model.seq_length", rule=AT_LEAST_ONE
    )
    activation: c.Activation = key(c.Activation.swiglu, OUTPUT, "the MLP's activation")
    normalization: c.Normalization = key(c.Normalization.RMSNorm, OUTPUT, "the layer norm")
    position_embedding: c.PositionEmbedding = key(c.PositionEmbedding.rope, OUTPUT, "positions")
    rotary_base: int = key(10000, OUTPUT, "RoPE's base", rule=POSITIVE)
    untie_embeddings: bool = key(True, OUTPUT, "an output layer of its own")
    add_bias_linear: bool = key(False, OUTPUT, "biases in the linear layers")
    init_method_std: float = key(0.02, OUTPUT, "the initial weights' deviation", rule=POSITIVE)
    hidden_dropout: float = key(0.0, OUTPUT, "dropout after attention and MLP", rule=FRACTION)
    attention_dropout: float = key(0.0, OUTPUT, "dropout of attention", rule=FRACTION)
    make_vocab_size_divisible_by: int = key(
        128, OUTPUT, "pad the vocabulary to a multiple", rule=AT_LEAST_ONE
    )
    moe: MoeConfig = field(default_factory=MoeConfig)
    # unless tokenizer.model is given, its tokenizer.model too (continued pretraining)
    init_from: str | None = key(
        None,
        OUTPUT,
        "start from a local Hugging Face Llama (or Mixtral) folder's weights",
        rule=r.A_FOLDER,
        common=True,
    )


@dataclass
class ParallelConfig:
    # Any: a number or auto (OmegaConf has no unions); what runs reads them typed
    # (pipeline.config.derived.settled)
    tensor: Any = command(
        1, "tensor-parallel size, or auto (GPU runs)", rule=r.whole_or(AUTO), common=True
    )
    pipeline: Any = command(
        1, "pipeline-parallel size, or auto (GPU runs)", rule=r.whole_or(AUTO), common=True
    )
    virtual_pipeline: int | None = command(
        None, "virtual stages per pipeline rank", rule=AT_LEAST_ONE, common=True
    )
    # none: on whenever tensor parallelism is, on GPUs (less activation memory, the same traffic)
    sequence_parallel: bool | None = command(None, "none: on with parallel.tensor > 1 on GPUs")
    distributed_optimizer: bool = command(True, "optimizer state sharded over data parallelism")
    # Communication overlap, as the fastest published Megatron runs use it; each is a no-op on
    # one GPU (no data-parallel or tensor-parallel peers to talk to)
    overlap_grad_reduce: bool = command(
        True, "gradients reduce-scattered bucket by bucket during the backward pass"
    )
    overlap_param_gather: bool = command(
        True, "with the distributed optimizer: weights all-gathered during the next forward"
    )
    # off until measured on several GPUs (tools/bench_scaling.py): it needs a TE build with
    # userbuffers
    tp_comm_overlap: bool = command(
        False, "TP with sequence parallelism: TE's userbuffers overlap its collectives with GEMMs"
    )
    ddp_bucket_size: int | None = command(
        None,
        "parameters per gradient-reduction bucket; none: megatron-core's (40M or 1M x DP)",
        rule=AT_LEAST_ONE,
    )
    # Uneven pipeline stages, as Megatron splits them: the embedding and the loss each count as
    # one layer when the layers are shared out, so the first and last stage hold one layer
    # fewer (126 layers over 16 stages: 7 + 14 x 8 + 7). Chosen over explicit first/last layer
    # counts because it also splits interleaved stages (Llama 3.1 405B's PP=8 x VP=8)
    account_for_embedding: bool = command(
        False, "the first pipeline stage counts the embedding as a layer"
    )
    account_for_loss: bool = command(
        False, "the last pipeline stage counts the output layer and loss as a layer"
    )
    # experts shared out over this many ranks of each data-parallel group (expert weights and
    # their optimizer state are split, the rest replicated as before)
    expert: int = command(
        1, "expert-parallel size, inside data parallelism (MoE models)", rule=AT_LEAST_ONE
    )
    # none: parallel.tensor, as megatron-core does
    expert_tensor: int | None = command(
        None, "tensor-parallel size of each expert; none: parallel.tensor", rule=AT_LEAST_ONE
    )
    # planned and estimated; training with it needs Transformer Engine on several GPUs
    context: int = command(
        1, "context-parallel size: each sequence split over this many GPUs", rule=AT_LEAST_ONE
    )
