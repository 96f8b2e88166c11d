"""A mixture of experts on the Transformer Engine path (one GPU): TE's grouped GEMM, the
all-to-all dispatcher and the fused permute and router kernels train it and its loss falls,
router health is logged, a resume continues the curve, the checkpoint evaluates in one
process, and fp8 GEMMs track bf16."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

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
