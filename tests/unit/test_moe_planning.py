"""The planner for mixture-of-experts models, checked by hand: total and active parameters
against the published figures, per-GPU shares under expert parallelism, Megatron-LM's FLOPs by
active parameters, memory and the layout search with expert parallelism."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline.config.sections.model import MoeConfig
from pipeline.model import flops
from pipeline.model.parameters import parameter_count, stage_params
from pipeline.planning import memory, search, throughput
from pipeline.planning.calibration import PublishedModel
from pipeline.planning.hardware import preset
from pipeline.planning.parallel_layout import ParallelLayout


def mixtral_8x7b() -> PublishedModel:
    return PublishedModel(
        name="mixtral-8x7b",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_query_groups=8,
        ffn_hidden_size=14336,
        seq_length=4096,
        moe=MoeConfig(experts=8, top_k=2),
    )


def qwen3_30b_a3b() -> PublishedModel:
    return PublishedModel(
        name="qwen3-30b-a3b",
        num_layers=48,
        hidden_size=2048,
        num_attention_heads=32,
        num_query_groups=4,
        kv_channels=128,  # not hidden / heads (64)
        ffn_hidden_size=6144,
        seq_length=4096,
        moe=MoeConfig(experts=128, top_k=8, ffn_hidden_size=768),
    )


def test_mixtral_8x7b_counted_by_hand():
    """Mixtral 8x7B (mistralai config.json): 32 layers, hidden 4096, 32 heads (8 KV), 8 experts of
    SwiGLU FFN 14336, top-2, vocabulary 32000 (a multiple of 128: unpadded), untied.

    attention: QKV 4096 x 128 x (32 + 16) = 25,165,824 + output 4096 x 4096 = 16,777,216
      = 41,943,040
    one expert: 4096 x 2 x 14336 + 14336 x 4096 = 176,160,768; eight: 1,409,286,144
    router 4096 x 8 = 32,768; two RMSNorms 8,192
    MoE layer: 1,451,270,144; transformer 32 x that + 4,096 final norm = 46,440,648,704
    embedding = output = 32000 x 4096 = 131,072,000
    total 46,702,792,704 (published: 46.7B)
    active layer: 41,943,040 + 2 x 176,160,768 + 32,768 + 8,192 = 394,305,536
    active: 32 x 394,305,536 + 4,096 + 262,144,000 = 12,879,925,248 (published: 12.9B)
    """
    counts = parameter_count(mixtral_8x7b(), 32000)
    assert counts["moe_layers"] == 32 and counts["dense_layers"] == 0
    assert counts["moe_layer"] == 1_451_270_144
    assert counts["experts_per_layer"] == 1_409_286_144
    assert counts["transformer"] == 46_440_648_704
    assert counts["total"] == 46_702_792_704
    assert counts["active"] == 12_879_925_248
    assert round(counts["total"] / 1e9, 1) == 46.7 and round(counts["active"] / 1e9, 1) == 12.9


def test_qwen3_30b_a3b_counted_by_hand():
    """Qwen3-30B-A3B (Qwen config.json): 48 layers, hidden 2048, 32 heads of 128 (4 KV), 128
    experts of SwiGLU FFN 768, top-8, vocabulary 151936 (unpadded), untied.

    attention: QKV 2048 x 128 x (32 + 8) = 10,485,760 + output 4096 x 2048 = 8,388,608
      = 18,874,368
    one expert: 2048 x 1536 + 768 x 2048 = 4,718,592; 128: 603,979,776; router 262,144
    MoE layer: 18,874,368 + 603,979,776 + 262,144 + 4,096 = 623,120,384
    total: 48 x 623,120,384 + 2,048 + 2 x 151936 x 2048 = 30,532,110,336 (published 30.5B;
      the real model also has per-head QK norms, 48 x 256 = 12,288 more, which the pipeline's
      models do not)
    active: 48 x (18,874,368 + 8 x 4,718,592 + 262,144 + 4,096) + 2,048 + 622,329,856
      = 3,353,020,416 (published 3.3B)
    With heads of hidden / heads = 64, as a config without kv_channels builds it, attention is
    half as large: 453M fewer, 30.08B total and 2.90B active.
    """
    counts = parameter_count(qwen3_30b_a3b(), 151936)
    assert counts["moe_layer"] == 623_120_384
    assert counts["total"] == 30_532_110_336
    assert counts["active"] == 3_353_020_416
    narrow = parameter_count(replace(qwen3_30b_a3b(), kv_channels=None), 151936)
    assert counts["total"] - narrow["total"] == 48 * 9_437_184


def test_a_dense_model_is_all_active():
    dense = replace(mixtral_8x7b(), moe=MoeConfig())
    counts = parameter_count(dense, 32000)
    assert counts["active"] == counts["total"] and counts["moe_layers"] == 0


def test_expert_parallelism_splits_the_experts_and_dense_first_layers_stay_dense():
    """Mixtral 8x7B, PP=4, EP=8: each stage 8 layers; per GPU one expert of each layer
    (8 x 176,160,768 = 1,409,286,144) and the rest whole: 8 x (41,943,040 + 32,768 + 8,192)
    = 335,872,000; the first stage + 131,072,000 embedding = 1,876,230,144.
    With the first 10 layers dense, stage 1 (layers 8-15) holds 2 dense layers of
    41,943,040 + 3 x 4096 x 14336 + 8,192 = 218,112,000 and 6 MoE layers."""
    m = mixtral_8x7b()
    first = stage_params(m, 32000, 1, 4, 0, expert=8)
    assert first["experts"] == 1_409_286_144
    assert first["total"] == 1_409_286_144 + 335_872_000 + 131_072_000
    dense_first = replace(m, moe=replace(m.moe, first_dense_layers=10))
    second = stage_params(dense_first, 32000, 1, 4, 1, expert=8)
    assert second["experts"] == 6 * 176_160_768
    assert second["total"] == 2 * 218_112_000 + 6 * (41_984_000 + 176_160_768)
    # expert tensor parallelism splits each expert too
    assert stage_params(m, 32000, 1, 4, 0, expert=4, expert_tensor=2)["experts"] == 1_409_286_144


def test_flops_count_the_active_experts():
    """Mixtral 8x7B, sequence 4096: per layer the MLP is 2 experts of 3 GEMMs, 4096 x 14336, and
    the router 4096 x 8: 352,354,304; QKV and output projection 41,943,040; causal core
    attention 4096 x 4096 / 2 x 2 = 16,777,216; logits 4096 x 32000 = 131,072,000.
    6 x (32 x (352,354,304 + 41,943,040 + 16,777,216) + 131,072,000) = 79,712,747,520."""
    assert flops.flops_per_token(mixtral_8x7b(), 32000, 1) == 79_712_747_520
    dense = replace(mixtral_8x7b(), moe=MoeConfig())
    assert flops.flops_per_token(dense, 32000, 1) < 79_712_747_520  # one MLP, not two
