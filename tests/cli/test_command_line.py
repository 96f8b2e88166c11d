"""The command lines as users type them: one line for a mistake, with the exit code, before
anything is written; the plan; one step run by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, cli

GPU_SLURM = ["train=gpu", "cluster=slurm", "cluster.gpus_per_node=8", "cluster.gpu=H100"]


def module(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", name, *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_command_line_reports_a_bad_value_in_one_line_without_traceback(tmp_path):
    result = cli(f"workdir={tmp_path}", "train.global_batch_size=30", timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: train.global_batch_size: 30 is not a multiple of train.micro_batch_size x "
        "data-parallel size = 8 x 1"
    )
    assert not any(tmp_path.iterdir()), "nothing may be written for an invalid config"


@pytest.mark.parametrize("sign", ["", "+"])
def test_command_line_rejects_an_unknown_key_naming_the_nearest(sign, tmp_path):
    result = cli(f"workdir={tmp_path}", f"{sign}train.micro_bach_size=4", timeout=120)
    assert result.returncode == 2
    assert result.stderr == (
        "error: train.micro_bach_size: not a setting of this pipeline; did you mean "
        "train.micro_batch_size?\n"
    )


def _train_script(stdout: str) -> str:
    """The train job's sbatch script from a dry run's output."""
    return stdout.split("# ---- train ----")[1].split("# ---- ")[0]


def _renamed(old: str) -> str:
    new = "resilience." + old.split(".")[1]
    return f"warning: {old} is now {new}; the old name still works, give the new one\n"


def test_a_renamed_key_still_works_under_its_old_name_with_one_warning(tmp_path):
    old = ["train.exit_signal_lead_s=300", "cluster.spare_nodes=1"]
    result = cli(f"workdir={tmp_path}", "cluster=slurm", "dry_run=true", *old, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith(
        _renamed("train.exit_signal_lead_s") + _renamed("cluster.spare_nodes")
    )
    assert result.stderr.count("warning: ") == 2
    script = _train_script(result.stdout)  # 1 node and its spare, signalled 300 s before
    assert "#SBATCH --nodes=2\n" in script and "#SBATCH --signal=USR2@300\n" in script


def test_a_site_config_file_with_an_old_key_name_still_works_with_one_warning(tmp_path):
    site = tmp_path / "site" / "cluster"
    site.mkdir(parents=True)
    (site / "mine.yaml").write_text(
        "defaults:\n  - slurm\n  - _self_\nspare_nodes: 1\nhang_timeout_s: 30\n"
    )
    result = module(
        "pipeline",
        f"--config-dir={tmp_path / 'site'}",
        "cluster=mine",
        "dry_run=true",
        f"workdir={tmp_path / 'run'}",
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.count(_renamed("cluster.spare_nodes")) == 1
    assert result.stderr.count(_renamed("cluster.hang_timeout_s")) == 1
    assert "[plan] hang watchdog: " in result.stderr and "30 s (resilience.hang_timeout_s)" in (
        result.stderr
    )
    assert "#SBATCH --nodes=2\n" in _train_script(result.stdout)


@pytest.mark.parametrize(
    "override",
    ["cluster.hang_timeout=5", "resilience.hang_timout_s=5", "+resilience.hang_timout_s=5"],
)
def test_an_unknown_key_near_a_renamed_one_names_the_new_key(override, tmp_path):
    result = cli(f"workdir={tmp_path}", override, timeout=120)
    assert result.returncode == 2
    key = override.lstrip("+").split("=")[0]
    assert result.stderr == (
        f"error: {key}: not a setting of this pipeline; did you mean resilience.hang_timeout_s?\n"
    )


def test_a_cpu_model_larger_than_this_machine_is_refused_with_its_size(tmp_path):
    big = ["model.hidden_size=65536", "model.ffn_hidden_size=262144", "model.num_layers=64"]
    result = cli(f"workdir={tmp_path / 'run'}", *big, timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith("error: model: 1 CPU rank(s) of this model need ~")
    assert "of this machine; choose a smaller" in result.stderr
    assert result.stderr.count("\n") == 1 and not (tmp_path / "run").exists()
    on_slurm = cli(
        f"workdir={tmp_path / 'run'}",
        "cluster=slurm",
        "cluster.mem_gb=4",
        "dry_run=true",
        *big,
        timeout=120,
    )
    assert on_slurm.returncode == 2
    assert "of cluster.mem_gb=4 of a node; choose a smaller" in on_slurm.stderr


def test_cli_reads_the_vocabulary_from_the_manifest_and_searches(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text(json.dumps({"vocab_size": 32000}))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.plan",
            f"workdir={tmp_path}",
            "model=gpt-1.3b",
            "train=gpu",
            "cluster.gpus_per_node=1",
            "--search",
            "--gpu-memory",
            "80",
            "--tokens",
            "1B",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "Vocabulary: 32000 (" in out.stdout and "manifest.json" in out.stdout
    assert "Parameters: 1.36 B (1,364,297,728)" in out.stdout
    assert "Token budget: 1 B (--tokens) = 1,908 steps" in out.stdout
    assert "Layout search" in out.stdout and "Rejected" in out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "pipeline.plan", f"workdir={tmp_path}", "train.micro_batch_size=3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "error: train.global_batch_size" in bad.stderr


def test_a_refused_launch_is_one_line_and_writes_nothing(tmp_path):
    workdir = tmp_path / "run"
    done = cli(f"workdir={workdir}", *GPU_SLURM, "cluster.time_limit=00:02:00", timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: cluster.time_limit: 00:02:00 leaves no time to train before the save signal "
        "120 s before the end; make it longer"
    ]
    assert not workdir.exists()


@pytest.mark.parametrize("entry", ["pipeline", "pipeline.step", "pipeline.plan", "pipeline.status"])
def test_every_entry_point_reports_a_bad_value_the_same_way(entry, tmp_path):
    args = ["verify"] if entry == "pipeline.step" else []
    result = module(entry, *args, f"workdir={tmp_path / 'run'}", "train.global_batch_size=30")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: train.global_batch_size: 30 is not a multiple")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_step_that_is_not_in_the_stages_is_named_in_one_line(tmp_path):
    result = module("pipeline.step", "shard", f"workdir={tmp_path}", "stages=[tokenize]")
    assert result.returncode == 2
    assert result.stderr == (
        "error: step 'shard' is not one of tokenizer, tokenize, verify for stages=['tokenize']\n"
    )


def test_one_step_by_hand_then_its_marker_makes_it_a_no_op(tmp_path):
    """What the sbatch templates in slurm/ do: each step through pipeline.step."""
    args = [f"workdir={tmp_path / 'run'}", "data.builtin_corpus_bytes=200000"]
    args.append("tokenizer.vocab_size=512")
    first = module("pipeline.step", "tokenizer", *args)
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "run" / "tokenizer" / "tokenizer.json").exists()
    again = module("pipeline.step", "tokenizer", *args)
    assert again.returncode == 0 and "[pipeline] tokenizer: already complete" in again.stderr
    quiet = module("pipeline.step", "tokenizer", "-q", *args)  # warnings and errors only
    assert quiet.returncode == 0 and "already complete" not in quiet.stderr, quiet.stderr


@pytest.mark.parametrize("entry", ["pipeline", "pipeline.step", "pipeline.plan", "pipeline.status"])
def test_every_entry_point_has_its_own_help(entry, tmp_path):
    result = module(entry, "--help")
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith(f"usage: python -m {entry} ")
    assert "  model=       gpt-1.3b, gpt-125m," in result.stdout  # the groups, from conf/
    assert (
        "\n  train.steps                  training steps; more continues a run (must be at least 1)\n"
        in result.stdout
    )
    assert (
        "  train.precision              the math's precision (fp32 | bf16 | fp16 | fp8)"
        in result.stdout
    )
    assert "Examples:\n  python -m " + entry in result.stdout
    assert "\n  resilience.spare_nodes       nodes a training job holds beyond" in result.stdout
    assert "cluster.spare_nodes" not in result.stdout


def test_pipeline_debug_shows_the_traceback_behind_the_line(tmp_path):
    env = {**os.environ, "PIPELINE_DEBUG": "1"}
    result = cli(f"workdir={tmp_path / 'run'}", "train.lr=0", timeout=120, env=env)
    assert result.returncode == 2
    assert result.stderr.startswith("Traceback (most recent call last):")
    assert result.stderr.endswith("error: train.lr: 0.0 must be a positive number\n")


@pytest.mark.parametrize(
    "given, line",
    [
        ("cluster.env.NCCL_DEBUG=INFO", "export NCCL_DEBUG=INFO"),
        ("cluster.sbatch_extra.constraint=h100", "#SBATCH --constraint=h100"),
    ],
)
def test_an_entry_of_a_free_form_mapping_is_set_as_help_says(given, line, tmp_path):
    """cluster.env and cluster.sbatch_extra hold any name: KEY.NAME=V sets it without the
    `+` that --help says is refused."""
    result = cli(f"workdir={tmp_path / 'run'}", "dry_run=true", "cluster=slurm", given, timeout=120)
    assert result.returncode == 0, result.stderr
    assert line in result.stdout


@pytest.mark.parametrize(
    "value", ["score >= 3", "lang == 'en' and score > 0.5", 'title != "x" or n < 2']
)
def test_an_override_hydra_cannot_read_gets_one_line_with_a_form_it_can(value, tmp_path):
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser

    result = cli(f"workdir={tmp_path / 'run'}", f"data.where={value}", timeout=120)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: data.where: ")
    assert "Hydra cannot read" in result.stderr
    suggested = shlex.split(
        result.stderr.strip().rsplit("quote it for the shell and for Hydra: ")[1]
    )
    assert len(suggested) == 1  # one shell word, which Hydra reads as the value given
    assert OverridesParser.create().parse_overrides(suggested)[0].value() == value
    assert not any(tmp_path.iterdir())


def test_a_sweep_checks_every_point_first_and_summarises_what_ran(tokenized, tmp_path):
    """An invalid point stops the sweep before any point runs; the points take the base run's
    settings; a point that fails as it runs is listed in sweep/summary.md, beside the point
    that ran, and the sweep exits 1."""
    from pipeline.config.compose import sweep_point_folder
    from tests.conftest import SMALL_SERIAL, copy_tokenized, lock_held

    base = copy_tokenized(tokenized, tmp_path / "base")
    settings = [*SMALL_SERIAL, "train.steps=4", "train.warmup_steps=1", "train.eval_interval=4"]
    made = cli(f"workdir={base}", *settings, "stages=[tokenize]", timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    common = ["-m", f"workdir={base}", "stages=[train]"]

    refused = cli(*common, "train.micro_batch_size=1,2,999", timeout=300)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("error: train.global_batch_size: ")
    assert "(sweep point train.micro_batch_size=999; no point has run)" in refused.stderr
    assert not (base / "sweep").exists()

    point = ["cluster=local", *common[1:]]
    held = base / "sweep" / sweep_point_folder(",".join(sorted([*point, "train.lr=0.002"])))
    held.mkdir(parents=True)
    with lock_held(held):
        swept = cli(*common, "train.lr=0.001,0.002", timeout=600)
    assert swept.returncode == 1, swept.stderr[-2000:]
    summary = (base / "sweep" / "summary.md").read_text()
    ran = next(line for line in summary.splitlines() if "train.lr=0.001" in line)
    ran_folder = base / "sweep" / ran.split("|")[1].strip()
    assert max(json.loads(r)["step"] for r in (ran_folder / "train/metrics.jsonl").open()) == 4
    assert f"Failed points:\n- {held.name}: " in summary and "in use" in summary
    assert all(any(p.iterdir()) for p in (base / "sweep").iterdir() if p.is_dir())
