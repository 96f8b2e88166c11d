"""A mixture of experts on the Transformer Engine path (one GPU): TE's grouped GEMM, the
all-to-all dispatcher and the fused permute and router kernels train it and its loss falls,
router health is logged, a resume continues the curve, the checkpoint evaluates in one
process, and fp8 GEMMs track bf16. Without dense first layers it exports as a Mixtral whose
bf16 test perplexity in transformers is the evaluation's, and model.init_from of that export
starts a run from its weights."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT
from tests.gpu.test_gpu_training import (  # noqa: F401  (data_dir: the shared fixture)
    close,
    curve,
    data_dir,
    kernels,
    pipeline,
    with_data,
)

# GPU_SMALL's shape with 8 experts of width 256 in layers 2-4, 2 per token
MOE = [
    "model.moe.experts=8",
    "model.moe.top_k=2",
    "model.moe.ffn_hidden_size=256",
    "model.moe.first_dense_layers=1",
]


# experts in every layer, as MixtralForCausalLM has them
MIXTRAL = [*MOE[:3], "model.moe.first_dense_layers=0"]


def _records(workdir: Path) -> list[dict]:
    lines = (workdir / "train" / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "loss" in r]


@pytest.fixture(scope="module")
def moe_run(data_dir, tmp_path_factory) -> tuple[Path, dict]:  # noqa: F811
    run = with_data(data_dir, tmp_path_factory.mktemp("gpu-moe") / "bf16")
    return run, pipeline(run, *MOE)


def test_a_mixture_of_experts_trains_on_grouped_gemm_and_its_loss_falls(moe_run):
    run, summary = moe_run
    assert summary["last_train_loss"] < summary["first_train_loss"] - 1.0
    assert summary["test_ppl"] < summary["vocab_size"] / 4  # evaluated in one process
    assert "grouped GEMM, all-to-all dispatch" in kernels(run)
    # 3 MoE layers of 8 experts, 2 active: active = total - 3 x 6 experts
    expert = 3 * 256 * 256  # SwiGLU: gated fc1 (2 x 256 x 256) and fc2 (256 x 256)
    assert summary["parameters"] - summary["active_parameters"] == 3 * 6 * expert
    last = _records(run)[-1]
    assert set(last["moe_layers"]) == {"2", "3", "4"}
    assert last["moe/max_over_mean"] >= 1.0 and 0 < last["moe/aux_loss"] < 10
    assert last["moe/dropped"] == 0.0  # dropless


def test_a_mixture_of_experts_resumes_on_its_curve(moe_run, tmp_path):
    reference, _ = moe_run
    run = tmp_path / "resume"
    shutil.copytree(reference, run, symlinks=True)
    shutil.rmtree(run / "checkpoints" / "iter_0000060")
    for path in ("train/DONE.json", "train/metrics.jsonl", "eval/DONE.json", "summary.json"):
        (run / path).unlink(missing_ok=True)
    pipeline(run, "stages=[tokenize,train]", *MOE)
    resumed, uninterrupted = curve(run), curve(reference)
    assert sorted(resumed) == list(range(31, 61))
    assert close(resumed, {s: uninterrupted[s] for s in resumed}, rtol=2e-3)


def test_fp8_experts_track_bf16(moe_run, data_dir, tmp_path):  # noqa: F811
    fp8 = with_data(data_dir, tmp_path / "fp8")
    pipeline(fp8, "stages=[tokenize,train]", *MOE, "train.precision=fp8")
    a, b = curve(moe_run[0]), curve(fp8)
    tail = [s for s in a if s > 50]
    assert tail and all(abs(a[s] - b[s]) <= 0.03 * a[s] for s in tail), (a, b)


@pytest.fixture(scope="module")
def mixtral_run(data_dir, tmp_path_factory) -> Path:  # noqa: F811
    """A mixture of experts with experts in every layer, trained on TE's grouped GEMM,
    evaluated and exported in bf16."""
    run = with_data(data_dir, tmp_path_factory.mktemp("gpu-mixtral") / "run")
    pipeline(run, *MIXTRAL, "stages=[tokenize,train,evaluate,export]", "export.dtype=bf16")
    return run


def test_a_grouped_gemm_mixture_exports_as_mixtral_with_its_perplexity(mixtral_run):
    """The experts of TEGroupedMLP (weight0..7 of one module) come out whole, in the Hub's
    Mixtral layout; transformers' bf16 Mixtral scores the evaluation's test windows to bf16's
    unit roundoff of the pipeline's perplexity."""
    record = json.loads((mixtral_run / "export" / "export.json").read_text())
    assert record["architecture"] == "MixtralForCausalLM" and record["dtype"] == "bf16"
    result = subprocess.run(
        [sys.executable, "tools/hf_perplexity.py", f"--workdir={mixtral_run}", "--device=cuda"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    measured = json.loads(result.stdout)["sets"]["test"]
    assert measured["transformers_tokens"] == measured["pipeline_tokens"] > 0
    assert abs(measured["ppl_relative_difference"]) <= 2.0**-8, measured


def test_a_mixtral_continued_on_the_gpu_starts_from_its_weights(mixtral_run, tmp_path):
    """model.init_from of the bf16 export into TE's grouped experts and the distributed
    optimizer's fp32 copy: at a learning rate of 1e-9, the fp32 export after one step holds the
    bf16 export's weights (the same tensor names, the same values to bf16 rounding)."""
    from safetensors.torch import load_file

    exported = mixtral_run / "export"
    original = {}
    for shard in sorted(exported.glob("*.safetensors")):
        original.update({n: t.float() for n, t in load_file(shard).items()})
    workdir = tmp_path / "run"  # tokenized with the export's tokenizer.model
    pipeline(
        workdir,
        *MIXTRAL,
        f"model.init_from={exported}",
        "stages=[tokenize,train,evaluate,export]",
        "train.steps=2",
        "train.warmup_steps=0",
        "train.lr=1e-9",
        "train.min_lr=0",
        "train.save_interval=2",
        "train.eval_interval=2",
        "export.dtype=fp32",
    )
    again = {}
    for shard in sorted((workdir / "export").glob("*.safetensors")):
        again.update(load_file(shard))
    assert again.keys() == original.keys()
    for name, tensor in original.items():
        torch.testing.assert_close(again[name], tensor, rtol=1e-2, atol=1e-5, msg=name)
