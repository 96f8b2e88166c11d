"""A mixture of experts trained on CPU ranks: two ranks sharing the experts out (expert
parallelism 2 inside data parallelism 2) follow one process's losses, report the same router
health, and their checkpoints continue in one process (expert parallelism 1, another
data-parallel size) and resume under their own layout on the uninterrupted curve."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline.core.paths import RunPaths
from pipeline.training import checkpoint
from tests.conftest import SMALL_SERIAL, cli, copy_tokenized

# moe-tiny shrunk to SMALL's shape: layer 1 dense, layer 2 eight experts of width 128, top 2;
# a line of metrics every step
MOE = ["model=moe-tiny", *SMALL_SERIAL, "train.log_interval=1", "stages=[train]"]
EXPERT_PARALLEL = ["cluster.executor=subprocess", "cluster.tasks_per_node=2", "parallel.expert=2"]
ONE_PROCESS = ["cluster.executor=inprocess", "cluster.tasks_per_node=1", "parallel.expert=1"]


@pytest.fixture(scope="module")
def runs(tokenized, tmp_path_factory) -> dict[str, Path]:
    out = {}
    for name, layout in (("one", []), ("ep2", EXPERT_PARALLEL)):
        workdir = copy_tokenized(tokenized, tmp_path_factory.mktemp(name))
        result = cli(f"workdir={workdir}", *MOE, *layout)
        assert result.returncode == 0, result.stderr[-3000:]
        out[name] = workdir
    return out


def _records(workdir: Path) -> dict[int, dict]:
    lines = (workdir / "train" / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines) if "loss" in r}


def _from_step_10(source: Path, target: Path) -> Path:
    """A copy of a finished run as if killed after its checkpoint of step 10."""
    shutil.copytree(source, target, symlinks=True)
    paths = RunPaths.of(target)
    shutil.rmtree(paths.checkpoints / checkpoint.folder_name(20))
    paths.train_done.unlink()
    paths.metrics.unlink()
    return target


def test_two_expert_parallel_ranks_follow_one_process(runs):
    """Each expert is drawn from the layer's seed and its number in the whole layer, so both
    layouts start from one model; the experts' gradients are summed over the ranks that hold
    them and divided by the data-parallel size, as megatron-core's DDP does."""
    one, split = _records(runs["one"]), _records(runs["ep2"])
    assert sorted(one) == sorted(split) == list(range(1, 21))
    for step in one:
        assert abs(one[step]["loss"] - split[step]["loss"]) <= 1e-3, step
        assert abs(one[step]["grad_norm"] - split[step]["grad_norm"]) <= 1e-3, step
        # the routers' counts are summed over the ranks, each routing its own tokens
        for key in ("moe/aux_loss", "moe/max_over_mean", "moe/dropped"):
            assert one[step][key] == pytest.approx(split[step][key], abs=1e-3), (key, step)
    assert list(split[20]["moe_layers"]) == ["2"]  # layer 1 is dense (first_dense_layers=1)
    assert split[20]["loss"] < split[1]["loss"]


def test_a_run_saved_at_expert_parallel_2_continues_in_one_process(runs, tmp_path):
    """The step-10 checkpoint of the two ranks (each holding four of the eight experts, and
    their AdamW moments) continues in one process holding all eight, on the one-process run's
    curve."""
    workdir = _from_step_10(runs["ep2"], tmp_path / "run")
    result = cli(f"workdir={workdir}", *ONE_PROCESS)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resumed from" in result.stderr and "at step 10" in result.stderr
    continued, one = _records(workdir), _records(runs["one"])
    assert sorted(continued) == list(range(11, 21))
    for step in continued:
        assert abs(continued[step]["loss"] - one[step]["loss"]) <= 1e-3, step
    attempts = json.loads(RunPaths.of(workdir).ranks.read_text())["attempts"]
    assert [len(a["ranks"]) for a in attempts] == [2, 1]


def test_an_interrupted_expert_parallel_run_resumes_on_its_own_curve(runs, tmp_path):
    workdir = _from_step_10(runs["ep2"], tmp_path / "run")
    result = cli(f"workdir={workdir}")  # the run's own settings, replayed from its history
    assert result.returncode == 0, result.stderr[-3000:]
    resumed, uninterrupted = _records(workdir), _records(runs["ep2"])
    assert sorted(resumed) == list(range(11, 21))
    for step in resumed:
        assert resumed[step]["loss"] == pytest.approx(uninterrupted[step]["loss"], rel=1e-6)
        shares = resumed[step]["moe_layers"]["2"]["share"]
        assert shares == pytest.approx(uninterrupted[step]["moe_layers"]["2"]["share"])
