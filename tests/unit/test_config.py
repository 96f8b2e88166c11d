"""Config composition and the checks users rely on before anything runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import ConfigError
from tests.conftest import CONF, make_config

GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir())


@pytest.mark.parametrize(
    "group,option",
    [(g, f.stem) for g in GROUPS for f in sorted((CONF / g).glob("*.yaml"))],
)
def test_every_config_file_composes(group, option, tmp_path):
    overrides = [f"{group}={option}"]
    if group == "data" and option == "jsonl":
        corpus = tmp_path / "c.jsonl"
        corpus.write_text('{"text": "hello"}\n')
        overrides.append(f"data.inputs=[{corpus}]")
    if (group == "model" and option != "tiny") or option == "gpu-cluster":
        # a layout that divides the big shapes and a batch that divides across 16 GPUs
        overrides += ["cluster.gpus_per_node=8", "train.global_batch_size=256"]
    cfg = make_config(tmp_path, *overrides)
    assert cfg[group] is not None


def test_grad_accum_is_derived_from_batch_sizes(tmp_path):
    cfg = make_config(tmp_path, "train.micro_batch_size=4", "train.global_batch_size=32")
    assert cfg.train.grad_accum == 8


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["train.micro_batch_size=4", "train.global_batch_size=30"], "train.global_batch_size"),
        (
            ["train.micro_batch_size=4", "train.global_batch_size=32", "train.grad_accum=2"],
            "train.global_batch_size",
        ),
        (["model.num_attention_heads=3"], "model.hidden_size"),
        (["model.num_query_groups=3"], "model.num_query_groups"),
        (["model.make_vocab_size_divisible_by=0"], "model.make_vocab_size_divisible_by"),
        (
            ["cluster.gpus_per_node=2", "parallel.tensor=2", "model.num_query_groups=1"],
            "parallel.tensor",
        ),
        (
            ["cluster.gpus_per_node=2", "parallel.pipeline=2", "model.num_layers=3"],
            "parallel.pipeline",
        ),
        (["parallel.tensor=3"], "parallel.tensor"),
        (["stages=[train,tokenize]"], "stages"),
        (["stages=[tokenise]"], "stages"),
        (["data.inputs=[/nonexistent/*.jsonl]"], "data.inputs"),
        (["data.split='90,10'"], "data.split"),
        (["data.split='90,10,0'"], "data.split"),
        (["tokenizer.model=/nonexistent.model"], "tokenizer.model"),
        (["train.precision=fp64"], "train.precision"),
        (["train.recompute=some"], "train.recompute"),
        (["train.warmup_steps=5000"], "train.warmup_steps"),
        (["model.seq_length=4096", "model.max_position_embeddings=2048"], "model.seq_length"),
        (["+eval.extra_sets.wiki=/nonexistent/*.jsonl"], "eval.extra_sets.wiki"),
        (["+eval.extra_sets.test=/nonexistent.jsonl"], "eval.extra_sets.test"),
        (["eval.max_batches=0"], "eval.max_batches"),
    ],
)
def test_invalid_config_names_the_key(overrides, key, tmp_path):
    with pytest.raises(ConfigError) as error:
        make_config(tmp_path, *overrides)
    assert str(error.value).startswith(f"{key}:"), error.value


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "cluster=local", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_command_line_reports_a_bad_value_in_one_line_without_traceback(tmp_path):
    result = _cli(f"workdir={tmp_path}", "train.global_batch_size=30", cwd=CONF.parent)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: train.global_batch_size: 30 is not a multiple of train.micro_batch_size x "
        "data-parallel size = 8 x 1"
    )
    assert not any(tmp_path.iterdir()), "nothing may be written for an invalid config"


def test_command_line_rejects_an_unknown_key(tmp_path):
    result = _cli(f"workdir={tmp_path}", "train.micro_bach_size=4", cwd=CONF.parent)
    assert result.returncode != 0
    assert "micro_bach_size" in result.stderr
    assert "Traceback" not in result.stderr
