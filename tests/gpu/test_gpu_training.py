"""The Transformer Engine path on real GPUs: the model learns in bf16 and fp8, resume continues
the loss curve, the profiler attributes device time, and 2-GPU data and tensor parallelism
match the 1-GPU curve."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import CONF

pytestmark = pytest.mark.gpu

GPU_SMALL = [
    "train=gpu",
    "cluster.gpus_per_node=1",
    "data.builtin_corpus_bytes=1500000",
    "data.num_shards=2",
    "tokenizer.vocab_size=1024",
    "model.seq_length=256",
    "model.num_layers=4",
    "model.hidden_size=256",
    "model.num_attention_heads=8",
    "model.num_query_groups=4",
    "model.ffn_hidden_size=768",
    "train.micro_batch_size=8",
    "train.global_batch_size=16",
    "train.steps=60",
    "train.lr=1e-3",
    "train.min_lr=1e-4",
    "train.warmup_steps=5",
    "train.log_interval=1",
    "train.eval_interval=30",
    "train.save_interval=30",
    "train.eval_iters=4",
]


def pipeline(workdir: Path, *args: str) -> dict:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "cluster=local",
            f"workdir={workdir}",
            *GPU_SMALL,
            *args,
        ],
        cwd=CONF.parent,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = workdir / "summary.json"
    return json.loads(summary.read_text()) if summary.exists() else {}


def curve(workdir: Path) -> dict[int, float]:
    lines = (workdir / "train" / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("gpu") / "base"
    pipeline(base, "stages=[tokenize]")
    return base


def with_data(data_dir: Path, workdir: Path) -> Path:
    workdir.mkdir(parents=True)
    for name in ("corpus", "tokenizer", "data"):
        shutil.copytree(data_dir / name, workdir / name, symlinks=True)
    return workdir


def close(a: dict[int, float], b: dict[int, float], rtol: float) -> bool:
    return a.keys() == b.keys() and all(abs(a[s] - b[s]) <= rtol * abs(a[s]) for s in a)


@pytest.fixture(scope="module")
def bf16_run(data_dir, tmp_path_factory) -> tuple[Path, dict]:
    """One whole bf16 run (train and evaluate): the reference curve for the other tests."""
    run = with_data(data_dir, tmp_path_factory.mktemp("gpu") / "bf16")
    return run, pipeline(run)


def test_bf16_trains_and_loss_falls(bf16_run):
    run, summary = bf16_run
    assert summary["last_train_loss"] < summary["first_train_loss"] - 1.0
    assert summary["test_ppl"] < summary["vocab_size"] / 4
    samples = json.loads((run / "eval" / "DONE.json").read_text())["samples"]
    assert samples and all(s["greedy"] for s in samples)


def test_resume_reproduces_the_uninterrupted_loss_curve(bf16_run, tmp_path):
    reference, _ = bf16_run
    run = tmp_path / "resume"
    shutil.copytree(reference, run, symlinks=True)
    shutil.rmtree(run / "checkpoints" / "iter_0000060")
    for path in ("train/DONE.json", "train/metrics.jsonl", "eval/DONE.json", "summary.json"):
        (run / path).unlink()
    pipeline(run, "stages=[tokenize,train]")
    resumed = curve(run)
    assert sorted(resumed) == list(range(31, 61))
    uninterrupted = curve(reference)
    assert close(resumed, {s: uninterrupted[s] for s in resumed}, rtol=2e-3), (
        resumed,
        uninterrupted,
    )


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_fp8_runs_and_tracks_bf16(bf16_run, data_dir, tmp_path, recipe):
    fp8 = with_data(data_dir, tmp_path / f"fp8-{recipe}")
    pipeline(fp8, "stages=[tokenize,train]", "train.precision=fp8", f"train.fp8_recipe={recipe}")
    a, b = curve(bf16_run[0]), curve(fp8)
    tail = [s for s in a if s > 50]
    assert all(abs(a[s] - b[s]) <= 0.03 * a[s] for s in tail), (a, b)


def test_profiled_steps_show_where_device_time_goes(data_dir, tmp_path):
    run = with_data(data_dir, tmp_path / "profiled")
    pipeline(run, "stages=[tokenize,train]", "train.steps=8", "train.profile_steps=[5,6]")
    table = (run / "train" / "profile.txt").read_text()
    assert "| gemm |" in table and "| attention |" in table, table


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize(
    "layout", [["parallel.tensor=1"], ["parallel.tensor=2"]], ids=["dp2", "tp2"]
)
def test_two_gpus_match_one_gpu(data_dir, tmp_path, layout):
    one = with_data(data_dir, tmp_path / "one")
    two = with_data(data_dir, tmp_path / "two")
    same_init = "train.init_on_cpu=true"  # the same initial weights under any TP layout
    pipeline(one, "stages=[tokenize,train]", same_init)
    pipeline(
        two,
        "stages=[tokenize,train]",
        same_init,
        "cluster.executor=subprocess",
        "cluster.gpus_per_node=2",
        *layout,
    )
    assert close(curve(one), curve(two), rtol=2e-2), (curve(one), curve(two))
