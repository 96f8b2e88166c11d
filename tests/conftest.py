"""Shared fixtures: configs composed exactly as the command line composes them, and one small
tokenized run (built-in corpus, real sentencepiece, real megatron-core shards) reused by tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import DictConfig

from pipeline import config

CONF = Path(__file__).resolve().parents[1] / "conf"
config.register()

# Small enough for seconds on 2 cores, large enough for every split to hold sequences.
SMALL = [
    "data.builtin_corpus_bytes=600000",
    "data.num_shards=2",
    "tokenizer.vocab_size=512",
    "model.seq_length=64",
    "model.num_layers=2",
    "model.hidden_size=64",
    "model.num_attention_heads=4",
    "model.num_query_groups=2",
    "model.ffn_hidden_size=192",
    "train.micro_batch_size=4",
    "train.global_batch_size=8",
    "train.steps=20",
    "train.warmup_steps=2",
    "train.log_interval=5",
    "train.eval_interval=10",
    "train.save_interval=10",
    "train.eval_iters=4",
]
# SMALL with one torch thread, for tests that start several pipelines: at this size a second
# thread buys nothing, and on a shared 2-core machine it spins against the other work.
SMALL_SERIAL = [*SMALL, "train.threads=1"]


def make_config(workdir: Path | str, *overrides: str, validate: bool = True) -> DictConfig:
    return config.compose(str(workdir), *overrides, check=validate)


@pytest.fixture(scope="session")
def tokenized(tmp_path_factory) -> DictConfig:
    """A run whose tokenize stage is complete: corpus, tokenizer, 2 shards, manifest."""
    from pipeline import graph

    cfg = make_config(tmp_path_factory.mktemp("run"), *SMALL)
    for step in graph.build(cfg):
        if step.name in ("tokenizer", "tokenize", "verify"):
            for index in range(step.array) if step.array else [None]:
                step.run(cfg) if index is None else step.run(cfg, index)
    return cfg


def copy_tokenized(tokenized: DictConfig, workdir: Path) -> Path:
    """The tokenized run's corpus, tokenizer and data copied into `workdir`."""
    import shutil

    src = Path(tokenized.workdir)
    for name in ("tokenizer", "data", "corpus"):
        shutil.copytree(src / name, workdir / name, symlinks=True)
    return workdir


@pytest.fixture
def run_copy(tokenized, tmp_path) -> DictConfig:
    """The tokenized run's data, copied into a fresh workdir for a test that trains."""
    return make_config(copy_tokenized(tokenized, tmp_path), *SMALL)


def cli(*args: str, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    """`python -m pipeline cluster=local ARGS` from the repository root, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "cluster=local", *args],
        cwd=CONF.parent,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


def loss_curve(workdir: Path | str) -> dict[int, float]:
    """Training loss by step from train/metrics.jsonl; every step must appear once."""
    lines = (Path(workdir) / "train" / "metrics.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if "loss" in r]
    steps = [r["step"] for r in records]
    assert len(steps) == len(set(steps)), f"steps logged twice: {steps}"
    return {r["step"]: r["loss"] for r in records}
