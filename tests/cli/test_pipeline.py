"""The whole pipeline through its command line, as users run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, SMALL, SMALL_SERIAL, cli, lock_held


def pipeline(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "cluster=local", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_whole_pipeline_then_rerun_and_single_stages(tmp_path):
    workdir = tmp_path / "run"
    first = pipeline(f"workdir={workdir}", *SMALL, "train.steps=40")
    assert f"Run folder: {workdir}" in first.stdout
    assert first.stdout.endswith(f"Report:     {workdir / 'report.html'} (report.md beside it)\n")
    summary = json.loads((workdir / "summary.json").read_text())
    for key in (
        "train_split_tokens",
        "all_splits_tokens",
        "vocab_size",
        "train_steps",
        "first_train_loss",
        "last_train_loss",
        "best_val_loss",
        "test_loss",
        "test_ppl",
        "tokens_per_s",
        "best_checkpoint",
    ):
        assert summary[key] is not None, key
    assert summary["train_steps"] == 40
    assert summary["last_train_loss"] < summary["first_train_loss"]
    assert summary["test_ppl"] < summary["vocab_size"] / 2
    assert Path(summary["best_checkpoint"]).is_dir()
    report = (workdir / "report.md").read_text()
    evaluation = json.loads((workdir / "eval" / "DONE.json").read_text())
    assert f"| test_ppl | {evaluation['test_ppl']} |" in report
    assert (workdir / "train" / "loss.png").read_bytes()[:4] == b"\x89PNG"
    assert (workdir / "report.html").exists()
    assert len(evaluation["samples"]) == 3
    assert all(s["greedy"] or s["sampled"] for s in evaluation["samples"])

    again = pipeline(f"workdir={workdir}", *SMALL, "train.steps=40")
    assert "already complete: tokenizer, tokenize, verify, index, train, evaluate" in again.stderr

    (workdir / "eval" / "DONE.json").unlink()
    alone = pipeline(
        f"workdir={workdir}",
        *SMALL,
        "train.steps=40",
        "stages=[evaluate]",
        "eval.checkpoint=latest",
    )
    assert "evaluate: running" in alone.stderr and "train: running" not in alone.stderr
    assert json.loads((workdir / "eval" / "DONE.json").read_text())["checkpoint_step"] == 40


def test_subprocess_executor_runs_the_array_and_two_gloo_ranks(finished_run, tmp_path):
    """Each step its own process through submitit; training on 2 data-parallel ranks matches
    the single-process loss curve (same global batch, same data order)."""
    one, two = finished_run.workdir, tmp_path / "two"  # both with one torch thread a rank
    two_ranks = pipeline(
        f"workdir={two}",
        *SMALL_SERIAL,
        "stages=[tokenize,train]",
        "cluster.executor=subprocess",
        "cluster.tasks_per_node=2",
    )
    assert len(list((two / "logs" / "jobs" / "tokenize").glob("*/*_result.pkl"))) == 2
    # rank 0's lines, followed from its log as they are written
    assert "step 20/20 | loss" in two_ranks.stderr
    assert "[train] 2 ranks on 1 node" in two_ranks.stderr
    assert "[train] kernels: megatron-core's local layers on the CPU" in two_ranks.stderr

    def curve(run: Path) -> list[float]:
        lines = (run / "train" / "metrics.jsonl").read_text().splitlines()
        return [r["loss"] for r in map(json.loads, lines) if "loss" in r]

    single, dual = curve(one), curve(two)
    assert len(single) == len(dual) > 0
    assert all(abs(a - b) < 1e-4 * abs(a) for a, b in zip(single, dual, strict=True))

    # the two ranks hashed their shares of each checkpoint: every file's digests are recorded
    from pipeline.training.checkpoint import block_digests

    for folder in sorted((two / "checkpoints").glob("iter_*")):
        complete = json.loads((folder / "COMPLETE.json").read_text())
        recorded = complete["sha256_blocks"]
        assert "rng_rank00001.pt" in recorded
        assert recorded == block_digests(folder, list(complete["files"]))


def test_a_second_launcher_on_the_same_workdir_refuses_and_names_the_holder(tmp_path):
    with lock_held(tmp_path) as holder:
        result = cli(f"workdir={tmp_path}", *SMALL, timeout=120)
    assert result.returncode == 3
    assert result.stderr.strip().startswith(
        f"error: workdir {tmp_path} is in use by pid {holder.pid}"
    )
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists()


def test_two_launches_racing_on_one_workdir_one_runs_and_the_other_names_it(tmp_path):
    """Both start at once on a fresh workdir: the lock is taken inside the real launch, and the
    one that loses names the winner even if it looks while the winner is still writing."""
    workdir = tmp_path / "run"
    command = [sys.executable, "-m", "pipeline", "cluster=local", f"workdir={workdir}"]
    command += SMALL_SERIAL
    logs = [tmp_path / f"launch{i}.err" for i in range(2)]
    launches = []
    for log in logs:
        with open(log, "w") as err:
            launches.append(
                subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
            )
    codes = [launch.wait(timeout=600) for launch in launches]
    assert sorted(codes) == [0, 3], [log.read_text()[-2000:] for log in logs]
    winner = launches[codes.index(0)]
    refused = logs[codes.index(3)].read_text()
    assert refused.count("\n") == 1, refused
    assert refused.startswith(f"error: workdir {workdir} is in use by pid {winner.pid} on ")
    assert json.loads((workdir / "summary.json").read_text())["train_steps"] == 20
