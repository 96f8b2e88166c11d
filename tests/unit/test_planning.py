"""The plan's arithmetic, checked by hand: parameter counts and per-GPU shares under tensor and
pipeline parallelism, Megatron-LM's FLOP formula, memory, wall time, the layout search, and
the checks before submission. (tests/integration/test_model.py compares the counts with the
megatron-core model itself.)"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace

import pytest

from pipeline.config import ClusterConfig, ConfigError
from pipeline.data import datasets, mixture
from pipeline.model import flops
from pipeline.model.parameters import layer_params, parameter_count, stage_params
from pipeline.model.stages import PipelineSplit
from pipeline.plan import pop_options, show
from pipeline.planning import memory, preflight, render, run_gpu, run_plan, search, throughput
from pipeline.planning.hardware import preset
from pipeline.planning.parallel_layout import ParallelLayout
from pipeline.planning.render import PlanOptions, plan_lines
from pipeline.runtime import gpus
from pipeline.runtime.gpus import capacity_bytes
from tests.conftest import GPU_GIVEN, changed, make_config


def test_gpt_1_3b_counted_by_hand(tmp_path):
    """conf/model/gpt-1.3b.yaml: 24 layers, hidden 2048, 16 heads, FFN 5632 SwiGLU, RMSNorm,
    untied, vocabulary 32000 (a multiple of 128, so unpadded at TP 1 and 2).

    per layer: QKV 2048 x 3*2048 = 12,582,912; output projection 2048 x 2048 = 4,194,304;
      FC1 2048 x 2*5632 = 23,068,672; FC2 5632 x 2048 = 11,534,336; two RMSNorms 2 x 2048
      = 51,384,320 (attention 16,777,216, MLP 34,603,008, norms 4,096)
    transformer: 24 x 51,384,320 + 2,048 (final norm) = 1,233,225,728
    embedding = output layer = 32,000 x 2048 = 65,536,000
    total: 1,233,225,728 + 2 x 65,536,000 = 1,364,297,728

    TP=2, PP=2: each stage 12 layers; per GPU a layer is (51,380,224 GEMM weights) / 2 +
      4,096 norm weights = 25,694,208, x 12 = 308,330,496
      first stage: + 65,536,000 / 2 embedding = 341,098,496
      last stage: + 2,048 final norm + 65,536,000 / 2 output layer = 341,100,544
    TP=4: the vocabulary pads to a multiple of 128 x 4 = 512: 32,256; per GPU
      24 x (51,380,224 / 4 + 4,096) + 2,048 + 2 x 32,256 x 2048 / 4 = 341,411,840
    """
    cfg = make_config(tmp_path, "model=gpt-1.3b")
    counts = parameter_count(cfg.model, 32000)
    assert counts["attention_per_layer"] == 16_777_216
    assert counts["mlp_per_layer"] == 34_603_008
    assert counts["norms_per_layer"] == 4_096
    assert counts["transformer"] == 1_233_225_728
    assert counts["embedding"] == counts["output_layer"] == 65_536_000
    assert counts["total"] == 1_364_297_728
    first, last = (stage_params(cfg.model, 32000, 2, 2, stage) for stage in (0, 1))
    assert (first["embedding"], first["output_layer"]) == (32_768_000, 0)
    assert first["total"] == 341_098_496
    assert (last["embedding"], last["output_layer"]) == (0, 32_768_000)
    assert last["total"] == 341_100_544
    assert parameter_count(cfg.model, 32000, tensor=4)["padded_vocab"] == 32_256
    assert stage_params(cfg.model, 32000, 4, 1, 0)["total"] == 341_411_840


def test_llama_8b_counted_by_hand(tmp_path):
    """conf/model/llama-8b.yaml with Llama 3's vocabulary of 128,256: 32 layers, hidden 4096,
    32 heads in 8 query groups (head dim 128), FFN 14336 SwiGLU, untied.

    per layer: QKV 4096 x (4096 + 2 x 1024) = 25,165,824; output 4096 x 4096 = 16,777,216;
      MLP 3 x 4096 x 14336 = 176,160,768; norms 8,192 -> 218,112,000
    total: 32 x 218,112,000 + 4,096 + 2 x 128,256 x 4096 = 8,030,261,248 (Llama-3-8B's count)
    TP=8: vocabulary pads to a multiple of 1024: 129,024; per GPU
      32 x (218,103,808 / 8 + 8,192) + 4,096 + 2 x 129,024 x 4096 / 8 = 1,004,802,048
    TP=2, PP=4, first stage: 8 x (218,103,808 / 2 + 8,192) + 128,256 x 4096 / 2 = 1,135,149,056
    """
    cfg = make_config(tmp_path, "model=llama-8b")
    assert parameter_count(cfg.model, 128256)["total"] == 8_030_261_248
    assert stage_params(cfg.model, 128256, 8, 1, 0)["total"] == 1_004_802_048
    assert stage_params(cfg.model, 128256, 2, 4, 0)["total"] == 1_135_149_056
    assert stage_params(cfg.model, 128256, 2, 4, 3)["total"] == 1_135_149_056 + 4_096


def test_uneven_stages_counted_by_hand(tmp_path):
    """gpt-1.3b (above) over 5 stages, TP=2, the embedding counted as a layer: 25 / 5 = 5 a
    stage, so the first holds 4 layers and the embedding, the others 5 layers each.
      first: 4 x 25,694,208 + 32,768,000 = 135,544,832
      middle: 5 x 25,694,208 = 128,471,040
      last: 128,471,040 + 2,048 final norm + 32,768,000 output layer = 161,241,088"""
    cfg = make_config(tmp_path, "model=gpt-1.3b")
    split = PipelineSplit(embedding=True)
    counts = [stage_params(cfg.model, 32000, 2, 5, s, split)["total"] for s in (0, 1, 4)]
    assert counts == [135_544_832, 128_471_040, 161_241_088]


def test_the_fullest_stage_and_a_split_sequence_set_the_memory(tmp_path):
    """126 layers over 16 stages with the embedding and the loss counted: the second stage holds
    8 layers and 15 micro-batches, more than the first's 7 x 16. Context parallelism keeps
    the activations of half a sequence."""
    cfg = make_config(tmp_path, "model=llama-8b", "model.num_layers=126")
    layout = ParallelLayout(
        tensor=8, pipeline=16, data=1, micro_batch=1, grad_accum=32, sequence_parallel=True
    )
    uneven = replace(layout, pipeline_split=PipelineSplit(embedding=True, loss=True))
    busiest = memory.memory_per_gpu(cfg.model, uneven.model_figures(cfg.model, 128256), uneven)
    assert busiest["stage"] == 1
    assert busiest["activations_per_micro_batch"] == 8 * memory.layer_activations(
        cfg.model, uneven.model_figures(cfg.model, 128256), uneven
    )
    halved = replace(layout, context=2)
    halves = memory.memory_per_gpu(cfg.model, halved.model_figures(cfg.model, 128256), halved)
    half_sequence = changed(cfg, "model", seq_length=cfg.model.seq_length // 2).model
    whole = memory.memory_per_gpu(
        half_sequence, layout.model_figures(half_sequence, 128256), layout
    )
    assert halves["activations_per_micro_batch"] == whole["activations_per_micro_batch"]


def test_tied_embeddings_need_an_output_copy_only_across_pipeline_stages(tmp_path):
    cfg = make_config(tmp_path, "model=gpt-350m")  # tied, learned positions, biases
    whole = stage_params(cfg.model, 50257, 1, 1, 0)
    assert whole["output_layer"] == 0
    last = stage_params(cfg.model, 50257, 1, 4, 3)
    assert last["output_layer"] == parameter_count(cfg.model, 50257)["word_embedding"]
    # row-parallel biases and norms stay whole on each tensor-parallel rank
    layer = layer_params(cfg.model)
    assert layer["attention"].replicated == 1024  # output projection bias
    assert layer["mlp"].replicated == 1024  # FC2 bias
    assert layer["norms"].replicated == 4 * 1024  # two LayerNorms, weight and bias


def test_flops_match_megatron_lm_by_hand(tmp_path):
    """Megatron-LM's num_floating_point_operations per token, 3 passes x 2 FLOPs per MAC:
    gpt-1.3b, s = 2048, vocabulary 32000:
      per layer: projections 2048 x (3 x 2048) + 2048 x 2048 = 16,777,216
                 core attention (causal half, QK^T and xV) 2048 x 2048 / 2 x 2 = 4,194,304
                 MLP 2048 x 5632 x 3 = 34,603,008            -> 55,574,528
      24 layers 1,333,788,672 + logits 2048 x 32000 = 65,536,000 -> 1,399,324,672
      x 6 = 8,395,948,032 per token; x 2048 = 17,194,901,569,536 per sequence
    llama-8b (GQA), s = 8192, vocabulary 128,256:
      per layer: 4096 x 6144 + 4096 x 4096 + 4096 x 8192 + 4096 x 14336 x 3 = 251,658,240
      (32 x 251,658,240 + 4096 x 128,256) x 6 = 51,470,401,536 per token
    """
    cfg = make_config(tmp_path, "model=gpt-1.3b", "model.seq_length=2048")
    assert flops.flops_per_token(cfg.model, 32000, 1) == 8_395_948_032
    assert flops.flops_per_sequence(cfg.model, 32000, 1) == 17_194_901_569_536
    llama = make_config(tmp_path, "model=llama-8b")
    assert flops.flops_per_token(llama.model, 128256, 1) == 51_470_401_536
    # the causal factor: doubling the sequence adds half the old full-matrix attention term
    longer = make_config(tmp_path, "model=gpt-1.3b", "model.seq_length=4096")
    extra = flops.flops_per_token(longer.model, 32000, 1) - flops.flops_per_token(
        cfg.model, 32000, 1
    )
    assert extra == 6 * 24 * 2048 * 2048


def _gpt3_layout(tmp_path, tensor: int, sp: bool, recompute: str):
    """A GPT-3-style layer as Korthikanti et al. count it: bf16, dropout, GeLU 4h, unfused
    attention."""
    cfg = make_config(
        tmp_path,
        "model=gpt-350m",
        "model.hidden_dropout=0.1",
        "model.attention_dropout=0.1",
        "model.seq_length=2048",
        validate=False,
    )
    layout = ParallelLayout(
        tensor=tensor,
        micro_batch=2,
        recompute=recompute,
        sequence_parallel=sp,
        fused_kernels=False,
    )
    return cfg, layout


def _layer_activations(m, layout, recompute=None):
    """One layer's activations, with the model's figures for `layout` (any vocabulary)."""
    return memory.layer_activations(m, layout.model_figures(m, 32000), layout, recompute)


@pytest.mark.parametrize("tensor", [1, 4])
def test_activations_reproduce_korthikanti(tmp_path, tensor):
    cfg, layout = _gpt3_layout(tmp_path, tensor, sp=False, recompute="none")
    s, b, h, a, t = 2048, 2, 1024, 16, tensor
    sbh = s * b * h
    assert _layer_activations(cfg.model, layout) == sbh * (10 + 24 / t) + 5 * a * s * s * b / t
    assert _layer_activations(cfg.model, replace(layout, sequence_parallel=True)) == (
        sbh * 34 / t + 5 * a * s * s * b / t
    )
    selective = replace(layout, recompute="selective", sequence_parallel=True)
    assert _layer_activations(cfg.model, selective) == sbh * 34 / t
    full = replace(layout, recompute="full", sequence_parallel=True)
    assert _layer_activations(cfg.model, full) == 2 * sbh / t


def test_activations_follow_the_kernels_and_shapes(tmp_path):
    cfg = make_config(tmp_path, "model=gpt-1.3b", *GPU_GIVEN, "cluster.gpus_per_node=1")
    layout = ParallelLayout.of(cfg)
    assert layout.fused_kernels and layout.precision == "bf16"
    s, b, h = 2048, layout.micro_batch, 2048
    sbh = s * b * h
    # no dropout, flash attention: 8 (norms) + 6 (QKV) + 2 (attention output)
    # + 2 x 2 x 5632/2048 (SwiGLU FC1 output) + 2 x 5632/2048 (FC2 input) = 32.5 s*b*h,
    # plus one fp32 log-sum-exp per head and token
    assert _layer_activations(cfg.model, layout) == 32.5 * sbh + 4 * 16 * s * b
    assert _layer_activations(cfg.model, replace(layout, recompute="selective")) == 32.5 * sbh
    fp8 = _layer_activations(cfg.model, replace(layout, precision="fp8"))
    assert fp8 < _layer_activations(cfg.model, layout)
    # GQA: fewer key/value heads keep less
    gqa = make_config(tmp_path, "model=gpt-1.3b", "model.num_query_groups=4", *GPU_GIVEN)
    assert _layer_activations(gqa.model, layout) == _layer_activations(
        cfg.model, layout
    ) - 2 * 2 * (s * b * 128 * 12)


def test_static_memory_per_parameter(tmp_path):
    cfg = make_config(tmp_path, "model=gpt-1.3b", *GPU_GIVEN, "cluster.gpus_per_node=8")
    n = stage_params(cfg.model, 32000, 1, 1, 0)["total"]
    figures = ParallelLayout().model_figures(cfg.model, 32000)
    dist = memory.memory_per_gpu(
        cfg.model, figures, ParallelLayout(data=8, distributed_optimizer=True)
    )
    plain = memory.memory_per_gpu(
        cfg.model, figures, ParallelLayout(data=8, distributed_optimizer=False)
    )
    assert (dist["weights"], dist["gradients"]) == (2 * n, 4 * n)
    assert plain["optimizer"] == 12 * n  # fp32 master + two Adam moments
    assert dist["optimizer"] == -(-12 * n // 8)  # sharded over data-parallel ranks
    fp32 = memory.memory_per_gpu(cfg.model, figures, ParallelLayout(precision="fp32"))
    assert (fp32["weights"], fp32["optimizer"]) == (4 * n, 8 * n)
    assert dist["overhead"] == memory.FIXED_OVERHEAD_BYTES
    parts = ("weights", "gradients", "optimizer", "activations", "logits", "working", "overhead")
    assert dist["total"] == sum(dist[key] for key in parts)


def test_pipeline_stages_hold_micro_batches_in_flight(tmp_path):
    cfg = make_config(tmp_path, "model=gpt-1.3b", *GPU_GIVEN, validate=False)
    layout = ParallelLayout(pipeline=4, grad_accum=8, micro_batch=4)
    assert [memory.micro_batches_in_flight(layout, s) for s in range(4)] == [4, 3, 2, 1]
    assert memory.micro_batches_in_flight(replace(layout, grad_accum=2), 0) == 2
    # interleaved: 2 (PP-1) + (v-1) PP + 1 chunks of 1/v stage on the first stage
    assert memory.micro_batches_in_flight(replace(layout, virtual_pipeline=2), 0) == 11 / 2
    figures = layout.model_figures(cfg.model, 32000)
    first = memory.stage_memory(cfg.model, figures, layout, 0)
    last = memory.stage_memory(cfg.model, figures, layout, 3)
    per_micro_batch = memory.stage_activations(cfg.model, figures, layout)
    assert first["activations"] == 4 * per_micro_batch
    assert last["activations"] == per_micro_batch
    assert first["logits"] == 0 < last["logits"]
    # bf16: final norm input and output [s, b, h], logits [s, b, vocab], and the output
    # layer's input and weight gradients
    s, b, h, v = 2048, 4, 2048, 32000
    assert last["logits"] == 2 * (2 * s * b * h + s * b * v + s * b * h + v * h)


def test_wall_time_for_a_token_budget(tmp_path):
    cfg = make_config(
        tmp_path,
        "model=gpt-1.3b",
        *GPU_GIVEN,
        "cluster.gpus_per_node=8",
        "cluster.gpu=H100",
        "train.micro_batch_size=4",
        "train.global_batch_size=64",
    )
    assert throughput.tokens_per_step(cfg) == 64 * 2048
    assert throughput.steps_for(1e9, cfg) == 7630  # ceil(1e9 / 131,072)
    # the wall time is the layout's own estimate of a step, not an assumed MFU
    vocab = datasets.vocab_size(cfg)[0]
    layout = ParallelLayout.of(cfg)
    step = throughput.expected_step(
        cfg.model, layout.model_figures(cfg.model, vocab), layout, preset("H100")
    )
    lines = plan_lines(cfg, run_plan.make(cfg), PlanOptions(tokens=1e9))
    wall = next(line for line in lines if line.startswith("Wall time:"))
    assert f"{step['step_s']:.2f} s/step" in wall
    assert f"MFU {step['mfu']:.2f}" in wall and "assumed" not in wall


def test_search_rejects_tensor_parallel_sizes_that_do_not_divide_heads(tmp_path):
    cfg = make_config(tmp_path, "model=gpt-1.3b", *GPU_GIVEN, "train.global_batch_size=48")
    found = search.search_layouts(cfg, 32000, gpus=6, gpu_memory_gb=80)
    assert "TP=3 does not divide 16 heads" in found.rejected
    assert "TP=6 does not divide 16 heads" in found.rejected
    assert {c.layout.tensor for c in found.feasible} <= {1, 2}
    assert {c.layout.pipeline for c in found.feasible} == {1, 2, 3, 6}  # all divide 24 layers
    llama = make_config(tmp_path, "model=llama-8b", *GPU_GIVEN, "train.global_batch_size=48")
    rejected = search.search_layouts(llama, 128256, gpus=6, gpu_memory_gb=141).rejected
    assert "TP=3 does not divide 32 heads" in rejected
    assert "PP=3 does not divide 32 layers" in rejected


def test_search_rejects_layouts_over_memory(tmp_path):
    cfg = make_config(tmp_path, "model=gpt-1.3b", *GPU_GIVEN, "train.global_batch_size=64")
    # 18 bytes per parameter of weights, gradients and Adam do not fit 24 GiB without sharding
    alone = search.search_layouts(cfg, 32000, gpus=1, gpu_memory_gb=24)
    assert not alone.feasible
    assert all(reason.endswith("> 24.0 GiB") for reason in alone.rejected)
    found = search.search_layouts(cfg, 32000, gpus=1, gpu_memory_gb=80)
    assert "TP=1 PP=1 DP=1 mbs=64 recompute=none" in " ".join(found.rejected)
    capacity = capacity_bytes(80)
    assert all(c.memory["total"] <= capacity for c in found.feasible)
    needs = [c for c in found.feasible if c.layout.micro_batch == 64]
    assert needs and all(c.layout.recompute == "full" for c in needs)


def test_best_layout_for_gpt_1_3b_needs_no_tensor_parallelism(tmp_path):
    cfg = make_config(tmp_path, "model=gpt-1.3b", *GPU_GIVEN, "train.global_batch_size=64")
    best = search.search_layouts(cfg, 32000, gpus=1, gpu_memory_gb=141).feasible[0]
    assert (best.layout.tensor, best.layout.pipeline) == (1, 1)
    assert best.layout.recompute == "none"
    many = make_config(tmp_path, "model=gpt-1.3b", *GPU_GIVEN, "train.global_batch_size=256")
    ranked = search.search_layouts(many, 32000, gpus=8, gpu_memory_gb=141).feasible
    assert (ranked[0].layout.tensor, ranked[0].layout.pipeline, ranked[0].layout.data) == (1, 1, 8)
    speeds = [c.throughput["tokens_per_s_per_gpu"] for c in ranked]
    assert speeds == sorted(speeds, reverse=True)
    # tensor parallelism across nodes pays for the network
    layout = ParallelLayout(tensor=8, micro_batch=8, grad_accum=32, sequence_parallel=True)
    figures = layout.model_figures(many.model, 32000)
    inside = throughput.expected_step(many.model, figures, layout, preset("H100"))
    four = replace(preset("H100"), nvlink_domain=4)
    across = throughput.expected_step(many.model, figures, layout, four)
    assert across["tp_comm_s"] > 2 * inside["tp_comm_s"]  # 4 NICs of 50 GB/s, not NVLink
    assert across["step_s"] > inside["step_s"]


def test_plan_options_are_taken_off_the_command_line():
    options, rest = pop_options(
        ["model=gpt-1.3b", "--search", "--gpu-memory", "141", "--tokens=2B", "plan.mfu=0.4"]
    )
    # the GPU flags set the run's GPU keys, so that every line is for that GPU
    assert rest == ["model=gpt-1.3b", "cluster.gpu_memory_gb=141"]
    assert (options.search, options.tokens, options.mfu) == (True, 2e9, 0.4)
    _, given = pop_options(["--gpu", "H200", "cluster.gpu=B200"])
    assert given == ["cluster.gpu=B200"]  # the override wins


def test_summary_lines_for_the_launcher(tmp_path):
    cfg = make_config(tmp_path, "model=gpt-1.3b", *GPU_GIVEN, "cluster.gpus_per_node=1")
    lines = render.summary_lines(cfg, run_plan.make(cfg, (32000, "given")))
    assert "1.36 B parameters" in lines[0] and "output layer 65.5 M" in lines[0]
    assert lines[1].startswith("[plan] memory per GPU ~")
    assert "524,288 tokens/step x 20000 steps" in lines[2]
    # the layout's own estimate on the run's GPU: H100 assumed, and said so, when none is named
    assert lines[3].startswith("[plan] expected on H100 (assumed: no cluster.gpu): ")
    assert "s/step (compute" in lines[3]
    # the hang watchdog's bounds: a save's once one is recorded (train/metrics.jsonl)
    assert lines[-1] == (
        "[plan] hang watchdog: a rank may make no progress for 10x the slowest step, at least "
        "60 s in a step; in a save 900 s until one is measured, then 10x the slowest; start-up, "
        "loading and validation 900 s"
    )
    metrics = tmp_path / "train" / "metrics.jsonl"
    metrics.parent.mkdir(parents=True)
    metrics.write_text('{"step": 10, "checkpoint_total_s": 12.5}\n{"step": 11, "loss": 3}\n')
    with_save = changed(cfg, "resilience", hang_timeout_s=20.0)
    assert (
        "in a save 125 s (10x the slowest save recorded, 12.5 s)"
        in render.summary_lines(with_save, run_plan.make(with_save, (32000, "given")))[-1]
    )


# --- checks before submission: what would fail after hours in the queue ---------------------

GPU_SLURM = [
    "train=gpu",
    "train.recompute=none",
    "parallel.tensor=1",
    "parallel.pipeline=1",
    "cluster=slurm",
    "cluster.gpus_per_node=8",
    "cluster.gpu=H100",
]


@pytest.mark.parametrize(
    "overrides,key,fragment",
    [
        (["train.precision=bf16"], "train.precision", "needs GPUs"),
        ([*GPU_SLURM, "cluster.gpu=A100", "train.precision=fp8"], "train.precision", "8.0"),
        (
            [*GPU_SLURM, "model=gpt-1.3b", "cluster.gpu=L4", "train.micro_batch_size=32"],
            "train.micro_batch_size",
            "the best layout that fits",
        ),
        (
            [*GPU_SLURM, "model=llama-8b", "cluster.gpu=V100", "cluster.gpus_per_node=1"],
            "train.micro_batch_size",
            "no layout of 1 GPUs fits",
        ),
        ([*GPU_SLURM, "cluster.time_limit=00:02:00"], "cluster.time_limit", "no time to train"),
        (["cluster.tasks_per_node=2", "parallel.context=2"], "parallel.context", "needs GPUs"),
        ([*GPU_SLURM, "parallel.context=2"], "parallel.context", "planned only"),
        (
            [
                *GPU_SLURM,
                "model=llama-8b",
                "parallel.tensor=8",
                "cluster.checkpoint_write_gbps=0.2",
            ],
            "resilience.exit_signal_lead_s",
            "set at least",
        ),
    ],
)
def test_preflight_refuses_what_would_fail_in_the_queue(overrides, key, fragment, tmp_path):
    cfg = make_config(
        tmp_path, "train.micro_batch_size=1", "train.global_batch_size=256", *overrides
    )
    with pytest.raises(ConfigError) as error:
        preflight.check_training(cfg, run_plan.make(cfg, (32000, "given")))
    assert str(error.value).startswith(f"{key}: ") and fragment in str(error.value)


def test_preflight_accepts_a_layout_that_fits_and_time_to_save(tmp_path):
    cfg = make_config(
        tmp_path, *GPU_SLURM, "model=gpt-1.3b", "train.micro_batch_size=4", "train.precision=fp8"
    )
    preflight.check_training(cfg, run_plan.make(cfg, (32000, "given")))


def test_the_time_estimate_of_an_fp32_run_uses_the_fp32_peak():
    from pipeline.runtime.gpus import peak_tflops

    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.0
    assert peak_tflops("NVIDIA H100 80GB HBM3", "fp8") == 2 * 989.0
    assert peak_tflops("NVIDIA H100 80GB HBM3", "fp32") == 67.0


# --- one GPU for every figure: named, found on this machine, or assumed and said so ---------


@pytest.mark.parametrize("gpu", ["H200", "L4", "B200", "A100"])
def test_every_line_of_the_plan_is_for_the_runs_gpu(gpu, tmp_path):
    cfg = make_config(
        tmp_path, "model=gpt-1.3b", *GPU_GIVEN, "cluster.gpus_per_node=8", f"cluster.gpu={gpu}"
    )
    lines = plan_lines(cfg, run_plan.make(cfg), PlanOptions(search=True))
    capacity = f"{capacity_bytes(gpus.memory_gb(gpu)) / 2**30:.1f} GiB"
    total = next(line for line in lines if line.strip().startswith("total"))
    assert f"of {capacity} of {gpu} (cluster.gpu={gpu})" in total
    wall = next(line for line in lines if line.startswith("Wall time:"))
    assert f" x {gpu} (" in wall
    search_head = next(line for line in lines if line.startswith("Layout search:"))
    assert f"x {gpu} (cluster.gpu={gpu}) ({capacity})" in search_head
    assert f"expected tokens/s on {gpu} " in search_head
    others = [name for name in gpus.GPUS if name not in gpu and gpu not in name]
    assert not [line for line in lines if any(name in line.split() for name in others)]
    assert render.plan_json(cfg, run_plan.make(cfg), PlanOptions())["gpu"] == gpu


def test_the_plan_refuses_fp8_where_the_launcher_does(tmp_path):
    cfg = make_config(tmp_path, *GPU_GIVEN, "cluster.gpu=A100", "train.precision=fp8")
    with pytest.raises(ConfigError, match=r"^train.precision: fp8 needs compute capability"):
        show(PlanOptions(), cfg)


@pytest.mark.parametrize(
    "cluster,detected,expected",
    [
        ({}, ("NVIDIA H200", 139.8), ("H200", int(139.8 * 2**30), "this machine's NVIDIA H200")),
        ({}, ("NVIDIA A100-SXM4-40GB", 39.5), ("A100", int(39.5 * 2**30), "this machine's")),
        ({"gpu": "B200"}, ("NVIDIA H200", 139.8), ("B200", capacity_bytes(180), "cluster.gpu")),
        ({"gpu_memory_gb": 141}, None, ("H200", capacity_bytes(141), "cluster.gpu_memory_gb")),
        ({"gpu_memory_gb": 80}, ("NVIDIA H100 80GB HBM3", 79.6), ("H100", None, "")),
        ({"gpu": "H2000", "gpu_memory_gb": 100}, None, ("H2000", capacity_bytes(100), "")),
        ({}, None, None),
    ],
)
def test_the_gpu_of_a_run_is_the_one_named_else_the_one_found_here(cluster, detected, expected):
    chosen = run_gpu.choose(replace(ClusterConfig(), **cluster), detected)
    if expected is None:
        assert chosen is None
        return
    name, capacity, source = expected
    assert chosen.name == name and source in chosen.source
    assert capacity is None or chosen.capacity == capacity


def test_a_gpu_found_on_this_machine_is_the_gpu_of_every_estimate(tmp_path, monkeypatch):
    monkeypatch.setattr(gpus, "local_gpu", lambda: ("NVIDIA H200", 139.8))
    cfg = make_config(tmp_path, "model=gpt-1.3b", *GPU_GIVEN, "cluster.gpus_per_node=1")
    assert render.summary_lines(cfg, run_plan.make(cfg, (32000, "given")))[3].startswith(
        "[plan] expected on H200: "
    )
    lines = plan_lines(cfg, run_plan.make(cfg), PlanOptions())
    assert "of 139.8 GiB of H200 (this machine's NVIDIA H200)" in "\n".join(lines)
    assert " x H200 (" in next(line for line in lines if line.startswith("Wall time:"))
    chosen = make_config(tmp_path, "train=gpu", "model=gpt-1.3b", "cluster.gpus_per_node=1")
    assert "(this machine's NVIDIA H200)" in chosen.train.auto_choice


def test_a_given_tokenizer_sets_the_vocabulary_and_tokenizer_vocab_size_is_not_carried(tmp_path):
    """model.init_from's tokenizer (or tokenizer.model) is the vocabulary the plan counts; the
    unused tokenizer.vocab_size is not in the run's config.yaml."""
    import io

    import sentencepiece as spm

    from pipeline import config

    llama = tmp_path / "llama"
    llama.mkdir()
    text = [f"line {i}: the quick brown fox jumps over {i * 7} lazy dogs" for i in range(300)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=model, vocab_size=100, minloglevel=2
    )
    (llama / "tokenizer.model").write_bytes(model.getvalue())
    for given in (f"model.init_from={llama}", f"tokenizer.model={llama / 'tokenizer.model'}"):
        cfg = make_config(tmp_path / "run", "model=tiny", given, "tokenizer.vocab_size=4096")
        assert cfg.tokenizer.vocab_size is None
        assert "4096" not in config.to_yaml(cfg)
        assert datasets.vocab_size(cfg) == (100, str(llama / "tokenizer.model"))
        lines = plan_lines(cfg, run_plan.make(cfg), PlanOptions())
        assert f"Vocabulary: 100 ({llama / 'tokenizer.model'}), padded to 128" in lines
    trained = make_config(tmp_path / "other", "model=tiny", "tokenizer.vocab_size=4096")
    assert trained.tokenizer.vocab_size == 4096
    assert datasets.vocab_size(trained) == (4096, "tokenizer.vocab_size")


# --- one plan, made once at launch and handed down -----------------------------------------


def _count_planning_calls(monkeypatch) -> dict[str, list]:
    """Every call of the memory and step-time estimates, by whichever planning module."""
    import importlib
    import pkgutil

    import pipeline.planning

    calls: dict[str, list] = {"memory_per_gpu": [], "expected_step": []}
    for info in pkgutil.iter_modules(pipeline.planning.__path__):
        module = importlib.import_module(f"pipeline.planning.{info.name}")
        for name, seen in calls.items():
            original = getattr(module, name, None)
            if original is None or info.name in ("memory", "throughput"):
                continue

            def counted(*args, _original=original, _seen=seen, **kwargs):
                _seen.append(args[2])  # the layout
                return _original(*args, **kwargs)

            monkeypatch.setattr(module, name, counted)
    return calls


def test_the_launcher_makes_the_plan_once_and_hands_it_down(tmp_path, monkeypatch, capsys):
    from pipeline.orchestration import launch

    monkeypatch.setattr(search, "_ESTIMATES", {})  # figures an earlier test made
    calls = _count_planning_calls(monkeypatch)
    counted_tokens = []
    known_train_tokens = mixture.known_train_tokens

    def counted(cfg):
        counted_tokens.append(cfg.workdir)
        return known_train_tokens(cfg)

    monkeypatch.setattr(mixture, "known_train_tokens", counted)
    cfg = make_config(  # the auto values' search, then the launcher
        tmp_path,
        *GPU_SLURM,
        "model=gpt-1.3b",
        "train.steps=10",
        "train.warmup_steps=1",
        "train.micro_batch_size=auto",
        "dry_run=true",
    )
    assert launch.launch(cfg, []) == 0
    layout = ParallelLayout.of(cfg)
    # the search made the chosen layout's figures; the plan, the preflight checks and the
    # printed plan read them: none made twice
    assert len(calls["memory_per_gpu"]) > 1
    assert calls["memory_per_gpu"].count(layout) == calls["expected_step"].count(layout) == 1
    # the sources' training tokens are estimated once, for the epoch check and the printed plan
    assert len(counted_tokens) == 1
    err = capsys.readouterr().err
    assert "[plan] expected on H100" in err and "[plan] data: " in err
    assert not run_plan.path(tmp_path).exists()  # a dry run writes nothing


def test_the_plan_in_the_run_folder_is_the_one_printed(tmp_path):
    cfg = make_config(tmp_path, *GPU_SLURM, "model=gpt-1.3b", "train.micro_batch_size=auto")
    plan = run_plan.make(cfg, (32000, "given"))
    written = run_plan.write(plan, cfg.workdir)
    assert written == tmp_path.resolve() / "plan.json"
    saved = json.loads(written.read_text())
    assert saved["layout"]["micro_batch"] == plan.layout.micro_batch == cfg.train.micro_batch_size
    assert saved["memory_bytes"]["total"] == plan.memory["total"]
    assert saved["step"]["step_s"] == plan.step["step_s"]
    assert saved["gpu"]["name"] == "H100" and saved["hardware"]["nvlink_domain"] == 8
    assert saved["reasons"] == cfg.train.auto_choice and "micro-batch" in saved["reasons"]
    assert saved["fits"] is True
    summary = render.summary_lines(cfg, plan)
    assert f"{plan.step['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU" in "\n".join(summary)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.layout = ParallelLayout()  # type: ignore[misc]
    with pytest.raises(TypeError):
        plan.memory["total"] = 0  # type: ignore[index]


def test_export_refuses_tokenizer_settings_transformers_cannot_reproduce(tmp_path):
    cfg = make_config(tmp_path, "model=tiny", "tokenizer.type=unigram")
    with pytest.raises(ConfigError) as error:
        preflight.check_export(cfg)
    assert str(error.value) == (
        "stages: export needs a tokenizer transformers reproduces; "
        "tokenizer.type=unigram cannot be, tokenizer.type=bpe can"
    )
