"""The throughput model against published runs (pipeline/planning/published.json) and the
single-H200 measurements, the planner's multi-GPU choices, and `python -m pipeline.plan`'s
--json and --validate."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from pipeline.core.errors import ConfigError
from pipeline.planning import calibration, calibration_report, hardware
from pipeline.planning.hardware import preset
from pipeline.planning.throughput import expected_step
from tests.conftest import ROOT, make_config


def step_of(row: calibration.Row, layout, hw) -> dict[str, float]:
    """The expected step of a published row's model under `layout` on `hw`."""
    return expected_step(row.model, layout.model_figures(row.model, row.vocab), layout, hw)


H200_GPT = ("train=gpu", "cluster=slurm", "cluster.gpus_per_node=1", "cluster.gpu=H200")
ROWS = calibration.load()


def test_published_rows_keep_the_bounds():
    complete = [r for r in ROWS if r.complete]
    assert len(complete) >= 20
    assert {r.hardware.name for r in complete} >= {"A100", "H100", "B200", "GB200", "H200"}
    assert min(r.layout.gpus for r in complete if r.hardware.name != "H200") == 8
    assert max(r.layout.gpus for r in complete) >= 2048
    for name, counted in calibration.counted_sets(ROWS).items():
        summary = calibration.bounds(calibration.errors(counted))
        assert summary["within"] >= calibration.SHARE_WITHIN, (name, summary)
        assert summary["median"] < calibration.MEDIAN_BOUND, (name, summary)


def test_a_held_out_part_is_never_fitted_on_and_comes_partly_from_other_sources():
    sets = calibration.counted_sets(ROWS)
    assert len(sets["fit"]) >= 30 and len(sets["held_out"]) >= 60
    assert not {r.id for r in sets["fit"]} & {r.id for r in sets["held_out"]}
    assert len(sets["unseen_sources"]) >= 40
    assert {r.hardware.name for r in sets["unseen_sources"]} >= {"H100", "B200", "GB200"}
    assert {r.layout.precision for r in sets["unseen_sources"]} >= {"bf16", "fp8"}


def test_a_row_without_a_role_is_named(tmp_path):
    data = json.loads(calibration.PUBLISHED.read_text())
    del data["rows"][3]["role"]
    path = tmp_path / "published.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=data["rows"][3]["id"]):
        calibration.load(path)


def test_every_row_names_its_source_and_how_it_counts():
    rows = json.loads(calibration.PUBLISHED.read_text())["rows"]
    for row in rows:
        source = row["source"]
        # a git source names its commit; a docs page without one, the release it describes
        assert source["url"] and (source["commit"] or source["version"]), row["id"]
        assert row["flops_counting"], row["id"]
        assert row["dp"] * row["tp"] * row["pp"] * row["cp"] == row["gpus"], row["id"]
        assert row["global_batch"] % (row["dp"] * row["micro_batch"]) == 0, row["id"]


def test_the_bounds_can_fail():
    """A model that halves the GEMM rate misses them, on the fitted and the held-out rows."""
    slow = replace(calibration.CONSTANTS, gemm_fraction=calibration.CONSTANTS.gemm_fraction / 2)
    slow = replace(slow, fp8_gemm_fraction=slow.fp8_gemm_fraction / 2)
    for counted in calibration.counted_sets(ROWS).values():
        assert not calibration.holds(calibration.bounds(calibration.errors(counted, slow)))


@pytest.mark.parametrize("model", ["gpt-350m", "gpt-1.3b", "gpt-2.7b"])
def test_the_h200_estimate_at_the_auto_choice_is_within_5_percent(tmp_path, model):
    # as docs/benchmarks.md measured: a 32k BPE, global batch 64
    settings = ("tokenizer.vocab_size=32000", "train.global_batch_size=64")
    cfg = make_config(tmp_path, *H200_GPT, f"model={model}", *settings)
    micro = cfg.train.micro_batch_size
    here = [r for r in ROWS if r.id.startswith(f"here-h200-{model}")]
    measured = {r.layout.micro_batch: r for r in here if r.layout.precision == "bf16"}
    assert micro in measured, f"auto chose micro-batch {micro}, not one measured"
    row = measured[micro]
    assert cfg.train.recompute == row.layout.recompute
    predicted = step_of(row, row.layout, preset("H200"))
    assert predicted["tokens_per_s_per_gpu"] == pytest.approx(row.published, rel=0.05)


def test_gpt_1_3b_on_four_h100_nodes_plans_plain_data_parallelism(tmp_path):
    cfg = make_config(
        tmp_path,
        "train=gpu",
        "cluster=slurm",
        "cluster.nodes=4",
        "cluster.gpus_per_node=8",
        "cluster.gpu=H100",
        "model=gpt-1.3b",
    )
    assert (cfg.parallel.tensor, cfg.parallel.pipeline) == (1, 1)
    assert cfg.parallel.overlap_grad_reduce and cfg.parallel.overlap_param_gather


def test_a_larger_nvlink_domain_makes_tensor_parallelism_cheaper():
    row = next(r for r in ROWS if r.id == "bridge2511-gb200-405B")
    rack = step_of(row, row.layout, preset("GB200"))
    pairs = replace(preset("GB200"), nvlink_domain=2)  # TP=4 across two NVLink domains
    nodes = step_of(row, row.layout, pairs)
    assert nodes["tp_comm_s"] > rack["tp_comm_s"]


def test_overlap_hides_the_data_parallel_reduction():
    row = next(r for r in ROWS if r.id == "nemo2407-h100-fp8-GPT3-175B-512")
    off = replace(row.layout, overlap_grad_reduce=False, overlap_param_gather=False)
    hidden = step_of(row, row.layout, row.hardware)["dp_comm_s"]
    exposed = step_of(row, off, row.hardware)["dp_comm_s"]
    assert exposed > 2 * hidden


def test_the_planner_choice_is_at_least_as_fast_or_says_why():
    for row_id in ("here-h200-gpt-1.3b", "nemo2407-h100-fp8-LLAMA3-8B"):
        row = next(r for r in ROWS if r.id == row_id)
        published = step_of(row, row.layout, row.hardware)
        text = calibration_report._choice_text(row, row.layout, published["tokens_per_s_per_gpu"])
        chosen = calibration_report.planner_choice(row)
        assert chosen is not None
        if chosen[1] < published["tokens_per_s_per_gpu"] * 0.995:
            assert "because" in text and "not explained" not in text, text


def test_the_report_prints_constants_rows_and_bounds():
    lines, ok = calibration_report.report_lines(choices=False)
    text = "\n".join(lines)
    assert ok
    assert "gemm_fraction" in text and "megatron21-a100-1T" in text
    assert "median absolute error" in text
    for name in calibration.SET_NAMES.values():
        assert f"{name}: " in text and "FAILS" not in text


def test_plan_json_is_one_object_with_the_estimate(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.plan",
            f"workdir={tmp_path}",
            "train=gpu",
            "cluster=slurm",
            "cluster.nodes=4",
            "cluster.gpus_per_node=8",
            "cluster.gpu=H100",
            "model=gpt-1.3b",
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    plan = json.loads(out.stdout)
    assert plan["layout"]["tp"] == 1 and plan["layout"]["dp"] == 32
    for key in ("tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "step_seconds"):
        assert plan[key] > 0
    parts = plan["breakdown"]
    assert set(parts) >= {"compute", "exposed_tp", "pp_bubble", "exposed_dp"}
    assert sum(parts.values()) == pytest.approx(plan["step_seconds"])
    assert 0 < plan["memory_gib_per_gpu"] < 80


def test_the_gradient_bucket_size_is_part_of_the_estimate():
    """parallel.ddp_bucket_size: small buckets pay NCCL's latency once each across 128 nodes."""
    row = next(r for r in ROWS if r.id == "here-h200-gpt-1.3b")
    wide = replace(row.layout, data=1024, micro_batch=1, grad_accum=1, overlap_param_gather=True)
    wide = replace(wide, overlap_grad_reduce=True)
    default = step_of(row, wide, preset("H100"))["dp_comm_s"]
    small = replace(wide, bucket_params=1_000_000)
    assert step_of(row, small, preset("H100"))["dp_comm_s"] > 2 * default


@pytest.mark.parametrize(
    "override,key",
    [
        ("cluster.network_gbps=0", "cluster.network_gbps"),
        ("cluster.nvlink_domain=0", "cluster.nvlink_domain"),
        ("parallel.ddp_bucket_size=0", "parallel.ddp_bucket_size"),
    ],
)
def test_machine_and_bucket_keys_refuse_nonsense(tmp_path, override, key):
    with pytest.raises(ConfigError, match=f"^{key}: "):
        make_config(tmp_path, override)


def test_cluster_keys_override_the_preset(tmp_path):
    cfg = make_config(tmp_path, *H200_GPT, "cluster.network_gbps=25", "cluster.nvlink_domain=72")
    hw = hardware.of(cfg)
    assert (hw.name, hw.network_gbps, hw.nvlink_domain, hw.hbm_gbps) == ("H200", 25, 72, 4800)
