"""Shared fixtures: configs composed exactly as the command line composes them, one small
tokenized run (built-in corpus, real sentencepiece, real Megatron-format shards) and one whole
run made by the command line, each reused by tests.

The tests are laid out by what they need, and each folder's tests carry its marker:

    unit/         no torch, no megatron-core: config, data files, planning, layering, executors
    integration/  CPU megatron-core in this process: datasets, model, training, checkpoints
    cli/          the command lines as users run them, in subprocesses
    slurm/        a real local Slurm cluster (tools/local_slurm.sh)
    gpu/          CUDA and Transformer Engine (deselected unless asked for: -m gpu)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline import config
from pipeline.config import PipelineConfig
from pipeline.planning import auto

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
CONF = ROOT / "conf"
FOLDERS = ("unit", "integration", "cli", "slurm", "gpu")

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
    "train.eval_samples=16",
]
# SMALL with one torch thread, for tests that start several pipelines: at this size a second
# thread buys nothing, and on a shared 2-core machine it spins against the other work.
SMALL_SERIAL = [*SMALL, "train.threads=1"]


def tier_of(item: pytest.Item) -> str:
    """The folder (and marker) a test belongs to: unit, integration, cli, slurm or gpu."""
    return Path(str(item.path)).resolve().relative_to(TESTS).parts[0]


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if tier_of(item) in FOLDERS:
            item.add_marker(tier_of(item))
    # the fast tiers first, so that a broken unit shows in a minute, not after the Slurm tests
    rank = {tier: n for n, tier in enumerate(FOLDERS)}
    items.sort(key=lambda item: rank.get(tier_of(item), len(FOLDERS)))


# Wall time of each tier, fixtures included, printed after the run: the suite's budget is kept
# tier by tier (the fast tier before each commit, all of them in CI).
_TIER_SECONDS: dict[str, list[float]] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    started = time.monotonic()
    yield
    spent = _TIER_SECONDS.setdefault(tier_of(item), [0.0, 0])
    spent[0] += time.monotonic() - started
    spent[1] += 1


def pytest_terminal_summary(terminalreporter):
    if not _TIER_SECONDS:
        return
    terminalreporter.write_sep("-", "time by tier")
    for tier in FOLDERS:
        if tier in _TIER_SECONDS:
            seconds, count = _TIER_SECONDS[tier]
            terminalreporter.write_line(f"{tier:<12} {count:>4} tests {seconds / 60:6.1f} min")


# train=gpu with the layout, micro-batch and recompute given, as the hand-worked figures of the
# planning tests assume (auto would choose them for a GPU the test names)
GPU_GIVEN = (
    "train=gpu",
    "train.micro_batch_size=8",
    "train.recompute=none",
    "parallel.tensor=1",
    "parallel.pipeline=1",
)


def make_config(workdir: Path | str, *overrides: str, validate: bool = True) -> PipelineConfig:
    """As the command line composes it: validated, auto values settled, derived values in."""
    return config.compose(str(workdir), *overrides, check=validate, settle=auto.settle)


def changed(cfg: PipelineConfig, section: str, **values) -> PipelineConfig:
    """A copy of `cfg` with some values of one section changed (configs are never mutated)."""
    return dataclasses.replace(
        cfg, **{section: dataclasses.replace(getattr(cfg, section), **values)}
    )


@pytest.fixture(scope="session")
def tokenized(tmp_path_factory) -> PipelineConfig:
    """A run whose tokenize stage is complete: corpus, tokenizer, 2 shards, manifest."""
    from pipeline.data.steps import TOKENIZE, TOKENIZER, VERIFY

    cfg = make_config(tmp_path_factory.mktemp("run"), *SMALL)
    TOKENIZE.prepare(cfg)  # the built-in corpus and the shard plan, as the launcher does
    for step in (TOKENIZER, TOKENIZE, VERIFY):
        step.run(cfg)
    return cfg


def _umask_027() -> None:
    os.umask(0o027)


@dataclasses.dataclass(frozen=True)
class FinishedRun:
    workdir: Path
    stderr: str  # what the command printed
    seconds: float  # how long the whole command took


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory) -> FinishedRun:
    """One whole run made by the command line with SMALL_SERIAL, every stage up to the export,
    under a team's umask (027): the uninterrupted reference of the tests that kill, stop or
    compare runs, the trained run of those that point commands at one, and the run whose file
    modes are checked. Tests copy it before changing anything in it."""
    workdir = tmp_path_factory.mktemp("finished") / "run"
    every_stage = "stages=[tokenize,train,evaluate,export]"
    started = time.time()
    result = cli(f"workdir={workdir}", *SMALL_SERIAL, every_stage, preexec_fn=_umask_027)
    assert result.returncode == 0, result.stderr[-3000:]
    return FinishedRun(workdir, result.stderr, time.time() - started)


def copy_tokenized(tokenized: PipelineConfig, workdir: Path) -> Path:
    """The tokenized run's corpus, tokenizer and data copied into `workdir`."""
    src = Path(tokenized.workdir)
    for name in ("tokenizer", "data", "corpus"):
        shutil.copytree(src / name, workdir / name, symlinks=True)
    return workdir


@pytest.fixture
def run_copy(tokenized, tmp_path) -> PipelineConfig:
    """The tokenized run's data, copied into a fresh workdir for a test that trains."""
    return make_config(copy_tokenized(tokenized, tmp_path), *SMALL)


def trainer_of(cfg: PipelineConfig):
    """The training loop of the train step, as the step builds it."""
    from pipeline.training.steps import TRAIN
    from pipeline.training.trainer import Trainer

    return Trainer(cfg, TRAIN.made_from(cfg))


def cli(*args: str, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    """`python -m pipeline cluster=local ARGS` from the repository root, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "cluster=local", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


def launch(*args: str, **kwargs) -> subprocess.Popen:
    """`python -m pipeline cluster=local ARGS` started from the repository root, not waited for:
    for tests that act on the run while it goes (signals, limits, frozen ranks)."""
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", "cluster=local", *args], cwd=ROOT, **kwargs
    )


def status(workdir: Path | str, *args: str) -> subprocess.CompletedProcess:
    """`python -m pipeline.status workdir=WORKDIR ARGS` (`make status`), output captured."""
    return module("pipeline.status", f"workdir={workdir}", *args, timeout=120)


def module(name: str, *args: str, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """`python -m NAME ARGS` (pipeline.status, pipeline.export, ...) from the repository root,
    output captured."""
    return subprocess.run(
        [sys.executable, "-m", name, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


@contextlib.contextmanager
def lock_held(folder: Path) -> Iterator[subprocess.Popen]:
    """Another process holding `folder`'s run lock, as a launcher does, until the block ends."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from pathlib import Path; from pipeline.core.lock import run_lock\n"
            f"with run_lock(Path({str(folder)!r})):\n    print('held', flush=True); time.sleep(60)",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def loss_curve(workdir: Path | str) -> dict[int, float]:
    """Training loss by step from train/metrics.jsonl; every step must appear once."""
    lines = (Path(workdir) / "train" / "metrics.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if "loss" in r]
    steps = [r["step"] for r in records]
    assert len(steps) == len(set(steps)), f"steps logged twice: {steps}"
    return {r["step"]: r["loss"] for r in records}
