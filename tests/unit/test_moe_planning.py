"""The planner for mixture-of-experts models, checked by hand: total and active parameters
against the published figures, per-GPU shares under expert parallelism, Megatron-LM's FLOPs by
active parameters, memory and the layout search with expert parallelism."""

from __future__ import annotations

from dataclasses import replace

from pipeline.config.sections.model import MoeConfig
from pipeline.model import flops
from pipeline.model.parameters import parameter_count, stage_params
from pipeline.planning import calibration, calibration_report, memory, run_plan, search, throughput
from pipeline.planning.calibration import PublishedModel
from pipeline.planning.hardware import preset
from pipeline.planning.parallel_layout import ParallelLayout
from pipeline.planning.render import PlanOptions, plan_lines
from tests.conftest import make_config


def _step(m, vocab: int, layout, hw) -> dict:
    """The expected step of `layout`, with the model's figures for that layout."""
    return throughput.expected_step(m, layout.model_figures(m, vocab), layout, hw)


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


def h200_shape() -> PublishedModel:
    """Issue 42's single-H200 shape: 16 layers, hidden 2048 (16 heads), 32 experts of FFN 1024,
    top-4, sequence 2048; vocabulary 50,304."""
    return PublishedModel(
        name="moe-32x4",
        num_layers=16,
        hidden_size=2048,
        num_attention_heads=16,
        ffn_hidden_size=1024,
        seq_length=2048,
        moe=MoeConfig(experts=32, top_k=4, ffn_hidden_size=1024),
    )


def test_expert_parallelism_shards_the_experts_state_over_the_expert_data_ranks():
    """Mixtral 8x7B on 32 GPUs, TP=1, PP=4, DP=8: with EP=8 each GPU holds one expert per layer,
    whose Adam state the distributed optimizer shards over the DP / EP = 1 ranks holding the
    same expert; the rest over DP=8."""
    m = mixtral_8x7b()
    whole = ParallelLayout(pipeline=4, data=8)
    split = replace(whole, expert=8)
    assert split.expert_data == 1 and whole.expert_data == 8
    params = stage_params(m, 32000, 1, 4, 0, expert=8)
    dense = params["total"] - params["experts"]
    static = memory.static_bytes(params, split)
    assert static["optimizer"] == 12 * (dense / 8 + params["experts"])
    assert static["weights"] == 2 * params["total"]
    one = memory.stage_memory(m, whole.model_figures(m, 32000), whole, 0)
    eight = memory.stage_memory(m, split.model_figures(m, 32000), split, 0)
    assert eight["weights"] < one["weights"] / 4  # 7 of 8 experts gone from each GPU


def test_a_moe_layer_keeps_its_routed_rows():
    """The H200 shape at micro-batch 1, bf16, no dropout: tokens 2048, routed rows 2048 x 4.
    Kept by the MoE MLP: router scores and probabilities 2 x 4 x 2048 x 32 = 524,288; per row
    2048 x (2 + 2) (FC1 input, the weighted experts' output) + 1024 x (2 x 2 + 2) (FC1 output,
    activation output) = 14,336 bytes: 8192 x 14,336 = 117,440,512. Attention as a dense layer:
    norms 2048 x 2048 x 8 = 33,554,432, QKV 2 x 2048 x 128 x 48 = 25,165,824, its output
    2048 x 2048 x 2 = 8,388,608, flash attention's log-sum-exp 4 x 16 x 2048 = 131,072."""
    layout = ParallelLayout(micro_batch=1)
    moe = memory.layer_activations(
        h200_shape(), layout.model_figures(h200_shape(), 32000), layout, "none", moe=True
    )
    attention = 33_554_432 + 25_165_824 + 8_388_608 + 131_072
    assert moe == attention + 524_288 + 117_440_512
    assert memory.dispatch_bytes(h200_shape(), layout) == 2 * 2 * 8192 * 2048


def test_the_all_to_all_costs_more_across_nodes_and_less_deduplicated():
    m, hw = qwen3_30b_a3b(), preset("H100")
    inside = ParallelLayout(data=8, expert=8, micro_batch=1, grad_accum=8, precision="fp8")
    across = replace(inside, data=16, expert=16)
    one = _step(m, 151936, replace(inside, expert=1, data=8), hw)
    assert one["ep_comm_s"] == 0
    a, b = (_step(m, 151936, lo, hw) for lo in (inside, across))
    assert b["ep_comm_s"] > 3 * a["ep_comm_s"] > 0  # 50 GB/s NICs, not NVLink
    dedup = _step(m, 151936, replace(across, ep_dedup=True), hw)
    assert dedup["ep_comm_s"] < b["ep_comm_s"] / 2  # a token crosses once, not ~top_k / 2 times
    hidden = _step(m, 151936, replace(across, ep_comm_overlap=True), hw)
    assert hidden["ep_comm_s"] < b["ep_comm_s"]


def test_the_search_opens_expert_parallelism_within_megatron_cores_rule():
    """EP divides the experts, and expert-TP x EP divides TP x CP x DP."""
    m = mixtral_8x7b()
    base = ParallelLayout(precision="bf16")
    found = search.search(m, 32000, 16, 64, preset("H100"), base, search.Constraints(tensors=(2,)))
    eps = {(c.layout.tensor, c.layout.expert) for c in found.feasible}
    assert {(2, 1), (2, 2), (2, 4), (2, 8)} <= eps
    assert all(c.layout.expert_data >= 1 for c in found.feasible)
    assert all(8 % c.layout.expert == 0 for c in found.feasible)
    fixed = search.search(
        m, 32000, 16, 64, preset("H100"), base, search.Constraints(tensors=(2,), experts=(4,))
    )
    assert {c.layout.expert for c in fixed.feasible} == {4}
    dense = replace(m, moe=MoeConfig())
    assert {
        c.layout.expert for c in search.search(dense, 32000, 8, 64, preset("H100"), base).feasible
    } == {1}


def test_the_h200_shape_gets_the_measured_best_layout():
    """The best hand-written loop measured on one H200 (issue 42): micro-batch 16, ~105 GiB,
    70.5k tokens/s; micro-batch 8: 51.7k. The search picks micro-batch 16 without recompute and
    estimates both within 10%."""
    hw, capacity = preset("H200"), int(140 * 2**30)
    base = ParallelLayout(precision="bf16")
    found = search.search(
        h200_shape(), 50304, 1, 64, hw, base, search.Constraints(capacity=capacity)
    )
    best = found.ranked()[0]
    assert (best.layout.micro_batch, best.layout.recompute) == (16, "none")
    assert abs(best.memory["total"] / 2**30 - 105) < 0.1 * 105
    for micro, measured in ((16, 70_500), (8, 51_700)):
        layout = replace(base, micro_batch=micro, grad_accum=64 // micro)
        estimate = _step(h200_shape(), 50304, layout, hw)
        assert abs(estimate["tokens_per_s_per_gpu"] / measured - 1) < 0.10


H200_MOE = (
    "train=gpu",
    "cluster=slurm",
    "cluster.gpus_per_node=1",
    "cluster.gpu=H200",
    "model=gpt-1.3b",
    "model.num_layers=16",
    "model.ffn_hidden_size=1024",
    "model.moe.experts=32",
    "model.moe.top_k=4",
    "model.moe.ffn_hidden_size=1024",
    "tokenizer.vocab_size=50304",
    "train.global_batch_size=64",
)


def test_the_plan_gives_active_parameters_and_the_all_to_all(tmp_path):
    cfg = make_config(tmp_path, *H200_MOE, "parallel.expert=1")
    plan = run_plan.make(cfg)
    text = "\n".join(plan_lines(cfg, plan, PlanOptions()))
    assert "Active parameters: 878 M (878,249,984; top 4)" in text
    assert "16 MoE x 218 M: 32 experts 201 M" in text
    assert "all-to-all 0.000 s" in text  # one GPU: nothing to exchange
    assert (plan.layout.micro_batch, plan.layout.recompute) == (16, "none")  # auto's choice
    assert plan.figures.parameters["active"] == parameter_count(cfg.model, 50304)["active"]


def test_validate_prints_the_moe_rows_apart():
    lines, ok = calibration_report.report_lines(choices=False)
    moe = {line.split(":")[0].strip(): line for line in lines if "of them MoE" in line}
    assert set(moe) == {"of them MoE, fitted", "of them MoE, held out"}
    held_out = calibration.moe_sets(calibration.load())["moe_held_out"]
    assert len(held_out) >= 40
    assert {r.model.name for r in held_out} >= {"Qwen3-30B-A3B", "Qwen3-235B-A22B", "Mixtral 8x7B"}
    assert ok
