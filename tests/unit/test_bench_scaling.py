"""tools/bench_scaling.py's parts that need no GPU: the layouts it runs, the overrides it
launches them with, and the planner's estimate it prints beside each measurement."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

from tests.conftest import ROOT
from tools import bench_scaling as bench


def test_data_tensor_and_pipeline_layouts_for_each_gpu_count():
    assert [lo.name for lo in bench.layouts(24, 1)] == ["data"]
    two = {lo.name: lo for lo in bench.layouts(24, 2)}
    assert set(two) == {"data", "tensor", "pipeline"}
    assert (two["tensor"].tensor, two["pipeline"].pipeline, two["pipeline"].virtual) == (2, 2, 2)
    eight = {lo.name: lo for lo in bench.layouts(32, 8)}
    assert (eight["tensor+pipeline"].tensor, eight["tensor+pipeline"].pipeline) == (2, 4)
    # 24 layers do not split over 16 stages; TP stays inside 8 GPUs
    assert {lo.name for lo in bench.layouts(24, 16)} == {"data", "tensor+pipeline"}


def test_the_stage_runs_one_process_per_gpu_under_the_layout():
    layout = bench.Layout("tensor", 4, 1)
    overrides = bench.run_overrides("gpt-1.3b", layout, 4, 8, 128, 11)
    assert "cluster.gpus_per_node=4" in overrides and "cluster.executor=subprocess" in overrides
    assert "parallel.tensor=4" in overrides and "parallel.sequence_parallel=true" in overrides
    assert overrides.count("stages=[train]") == 1
    assert not any(o.startswith("cluster.gpus_per_node=1") for o in overrides)


def test_the_estimate_printed_beside_each_measurement():
    args = SimpleNamespace(micro_batch=8, warmup=3, steps=8)
    data = bench.Layout("data", 1, 1)
    overrides, plan = bench.fitting("gpt-1.3b", data, 8, args, 256, "NVIDIA H100 80GB HBM3")
    assert plan["fits"] and "train.recompute=none" in overrides
    assert 0.3 < plan["mfu"] < 0.7
    # llama-8b on two GPUs: nothing fits without sharding the optimizer further
    one = SimpleNamespace(micro_batch=1, warmup=3, steps=8)
    _, big = bench.fitting("llama-8b", data, 2, one, 64, "NVIDIA H100 80GB HBM3")
    assert not big["fits"]


def test_help_is_clean():
    out = subprocess.run(
        [sys.executable, "tools/bench_scaling.py", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and not out.stderr
    assert "--workdir" in out.stdout and "--sequences-per-gpu" in out.stdout
