"""`kill -9` of the whole pipeline at random moments inside each step: rerunning the same
command on the same workdir finishes, redoes only what was incomplete, and ends with the loss
curve and test loss of a run that was never interrupted, bit for bit."""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from pipeline.core.paths import RunPaths
from pipeline.orchestration import graph
from pipeline.training import checkpoint
from tests.conftest import SMALL_SERIAL, cli, launch, loss_curve, make_config

STEPS = ("tokenizer", "tokenize", "verify", "index", "train", "evaluate")


@pytest.fixture(scope="module")
def uninterrupted(finished_run) -> tuple[Path, dict[str, float]]:
    """A clean run, and how long each of its steps took."""
    pattern = r"\] (\w+): done in ([.\d]+) s"
    took = {m[1]: float(m[2]) for m in re.finditer(pattern, finished_run.stderr)}
    took["start"] = finished_run.seconds - took["export"]  # the command, to its evaluation
    took["saved"] = took["train"] / 2  # from the first of two checkpoints
    return finished_run.workdir, took


def kill_during(workdir: Path, step: str, delay: float) -> None:
    """Start the pipeline, wait until `step` starts (for "start", the command itself; for
    "saved", training's first checkpoint), then SIGKILL it `delay` seconds later."""
    proc = launch(
        f"workdir={workdir}",
        *SMALL_SERIAL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    started = threading.Event()
    if step == "start":
        started.set()
    stage = "train" if step == "saved" else step

    def read() -> None:  # keeps the pipe drained, so the child never blocks on its output
        for line in proc.stderr:
            if line.startswith(f"[pipeline] {stage}: running"):
                started.set()
        started.set()  # the command ended

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert started.wait(timeout=300), f"{step} never started"
    assert proc.poll() in (None, 0), f"the pipeline failed before {step}"
    tracker = RunPaths.of(workdir).checkpoints / checkpoint.TRACKER
    while step == "saved" and not tracker.exists() and proc.poll() is None:
        time.sleep(0.002)
    time.sleep(delay)
    proc.kill()
    proc.wait()
    reader.join()


def complete_steps(workdir: Path) -> list[str]:
    cfg = make_config(workdir, *SMALL_SERIAL)
    return [s.name for s in graph.steps(cfg) if s.is_complete(cfg)]


CASES = [(step, seed) for seed, step in enumerate(STEPS)] + [("start", 6), ("saved", 7)]


@pytest.mark.parametrize("step,seed", CASES, ids=[f"{s}-{n}" for s, n in CASES])
def test_killed_at_a_random_moment_the_rerun_finishes_as_if_never_killed(
    uninterrupted, tmp_path, step, seed
):
    clean, took = uninterrupted
    workdir = tmp_path / "run"
    kill_during(workdir, step, random.Random(seed).uniform(0, took[step]))

    done = complete_steps(workdir)
    paths = RunPaths.of(workdir)
    shard_markers = {p: p.stat().st_mtime_ns for p in paths.data_dir.glob("*.done.json")}
    resumable = checkpoint.latest(paths.checkpoints) if paths.checkpoints.exists() else None
    assert resumable or step != "saved"

    rerun = cli(f"workdir={workdir}", *SMALL_SERIAL)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    if done:
        assert f"already complete: {', '.join(done)}\n" in rerun.stderr
    for name in STEPS:
        assert (f"[pipeline] {name}: running" in rerun.stderr) == (name not in done), name
    assert all(p.stat().st_mtime_ns == t for p, t in shard_markers.items()), "shard redone"
    if resumable and "train" not in done:
        assert f"resumed from {resumable} at step" in rerun.stderr

    assert loss_curve(workdir) == loss_curve(clean)
    summary, reference = (json.loads((w / "summary.json").read_text()) for w in (workdir, clean))
    assert summary["test_loss"] == reference["test_loss"]
    assert paths.report.exists()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_stop_signal_in_training_saves_stops_the_chain_and_the_rerun_resumes(
    uninterrupted, tmp_path, stop
):
    """SIGTERM (preemption, or a user's kill) and Ctrl-C are not a crash: training saves at the
    next step and stops; run locally, evaluation must not run on the half-trained model."""
    clean, _ = uninterrupted
    workdir = tmp_path / "run"
    with open(tmp_path / "stderr", "w+") as stderr:
        proc = launch(f"workdir={workdir}", *SMALL_SERIAL, stdout=subprocess.DEVNULL, stderr=stderr)
        metrics = RunPaths.of(workdir).metrics  # first written at step 5 of 20
        while not metrics.exists() and proc.poll() is None:
            time.sleep(0.002)
        proc.send_signal(stop)
        assert proc.wait(timeout=300) == 1
        stderr.seek(0)
        log = stderr.read()
    stopped = re.search(r"error: train: stopped by a signal at step (\d+) after saving; rerun", log)
    assert stopped and log.endswith("rerun the same command to resume\n"), log[-2000:]
    assert "evaluate: running" not in log and "Traceback" not in log
    assert f"{stop.name}: saved step {stopped[1]}, exiting" in log
    step = int(stopped[1])
    rerun = cli(f"workdir={workdir}", *SMALL_SERIAL)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    folder = RunPaths.of(workdir).checkpoints / checkpoint.folder_name(step)
    assert f"resumed from {folder} at step {step}" in rerun.stderr
    assert loss_curve(workdir) == loss_curve(clean)


@pytest.fixture(scope="module")
def long_corpus(tmp_path_factory) -> Path:
    """Random words enough that tokenizing them takes seconds."""
    rng = random.Random(0)
    words = [
        "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(5000)
    ]
    corpus = tmp_path_factory.mktemp("long") / "corpus.jsonl"
    with open(corpus, "w") as f:
        for _ in range(20000):
            f.write(json.dumps({"text": " ".join(rng.choices(words, k=300))}) + "\n")
    return corpus


@pytest.mark.parametrize(
    ("sent", "code", "said"),
    [
        (signal.SIGINT, 130, "interrupted (Ctrl-C)"),
        (signal.SIGTERM, 143, "terminated (SIGTERM)"),
    ],
)
def test_a_stop_signal_outside_training_is_one_line_and_the_rerun_completes(
    long_corpus, tmp_path, sent, code, said
):
    """Ctrl-C or SIGTERM while tokenizing stops at once, in one line, keeping what is whole."""
    args = [f"workdir={tmp_path / 'run'}", "data=jsonl", f"data.inputs=[{long_corpus}]"]
    args += ["stages=[tokenize]", "tokenizer.vocab_size=1200", "data.num_shards=2"]
    proc = launch(*args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = ""
    while "tokenize: running" not in seen and proc.poll() is None:
        seen += proc.stderr.readline()
    proc.send_signal(sent)
    rest = proc.communicate(timeout=120)[1]
    assert proc.returncode == code, seen + rest
    assert (seen + rest).endswith(
        f"error: {said}: complete outputs are kept; rerun the same command to go on\n"
    )
    assert "Traceback" not in rest
    rerun = cli(*args)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
