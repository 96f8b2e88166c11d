"""Training FLOPs with Megatron-LM's formula (`num_floating_point_operations`).

Matches `num_floating_point_operations` in Megatron-LM's megatron/training/training.py for a
dense GPT (no MoE, MLA, MTP or linear attention) on unpacked [batch, seq] inputs, as of
NVIDIA/Megatron-LM main (d98e8a6) and the core_v0.16.1 tag (55ac708): every GEMM counted three
times (forward, data gradient, weight gradient) at 2 FLOPs per multiply-add; core attention
(Q K^T and softmax x V) counted over half the s x s matrix, the causal mask's non-zero part
(since Megatron-LM 8873b55, March 2025; earlier versions counted the full matrix).

A mixture-of-experts model is counted by its active parameters, as Megatron-LM counts it: a MoE
layer's MLP is its top_k experts and its shared expert; besides Megatron-LM, the router's
hidden x experts GEMM (under 1% of the MLP in the shapes here).
"""

from __future__ import annotations

from pipeline.config import ModelConfig
from pipeline.model.sizes import (
    expert_ffn_hidden_size,
    ffn_hidden_size,
    kv_channels,
    moe_layers,
    padded_vocab,
)


def flops_per_token(m: ModelConfig, vocab_size: int, tensor: int) -> float:
    """Forward and backward FLOPs per token of a sequence of model.seq_length tokens, the
    vocabulary padded for `tensor` tensor-parallel ranks."""
    s, h, layers = m.seq_length, m.hidden_size, m.num_layers
    heads = m.num_attention_heads
    groups = m.num_query_groups or heads
    head_dim = kv_channels(m)
    query = head_dim * heads  # query projection width
    key_value = head_dim * groups  # key (and value) projection width
    passes_x_fma = 3 * 2  # forward, dgrad, wgrad; 2 FLOPs per multiply-add
    ffn_gemms = 3 if m.activation == "swiglu" else 2  # h -> 2 x ffn (gated) and ffn -> h
    moe = moe_layers(m)
    mlp = h * ffn_hidden_size(m) * ffn_gemms * (layers - moe)
    if moe:
        routed = expert_ffn_hidden_size(m) * m.moe.top_k + m.moe.shared_expert_ffn_hidden_size
        mlp += (h * routed * ffn_gemms + h * m.moe.experts) * moe  # experts, shared, router
    projections = h * (query + 2 * key_value) + query * h  # QKV and output projection
    core_attention = query * s / 2 * 2  # causal: half the s x s matrix; Q K^T and x V
    logits = h * padded_vocab(vocab_size, m, tensor)
    return passes_x_fma * (mlp + layers * (projections + core_attention) + logits)


def flops_per_sequence(m: ModelConfig, vocab_size: int, tensor: int) -> float:
    """Forward and backward FLOPs of one sequence of model.seq_length tokens."""
    return flops_per_token(m, vocab_size, tensor) * m.seq_length
