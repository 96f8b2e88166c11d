"""The training job's supervisor, without Slurm: stand-in srun, squeue, scontrol and sinfo
replay a recorded sequence of attempts (how each ended, what its ranks left, which nodes the
job held after it), and the test reads what the supervisor recorded in train/failures.jsonl,
which nodes each attempt ran on and what it asked of Slurm. The same runs on a real cluster:
tests/slurm/test_crashes_on_slurm.py and test_hangs_on_slurm.py."""

from __future__ import annotations

import json
import signal
import stat
from pathlib import Path

import pytest

from pipeline.core.paths import RunPaths
from pipeline.resilience.decisions import Limits
from pipeline.resilience.records import Action, FaultKind, FaultRecord
from pipeline.resilience.supervisor import Attempts, Supervisor

CRASH_N2 = "srun: error: n2: task 1: Exited with exit code 1"
# each stand-in: $SEQ holds the recorded sequence, $CALLS gets every call
FAKES = {
    "srun": """
attempt=$PIPELINE_ATTEMPT
echo "srun $*" >> "$CALLS"
[ -f "$SEQ/$attempt.died" ] && cp "$SEQ/$attempt.died" "$PROGRESS/died-1.json"
[ -f "$SEQ/$attempt.hang" ] && cp "$SEQ/$attempt.hang" "$PROGRESS/hang-n2.json"
[ -f "$SEQ/$attempt.held" ] && cp "$SEQ/$attempt.held" "$SEQ/held"
[ -f "$SEQ/$attempt.stderr" ] && cat "$SEQ/$attempt.stderr" >&2
exit $(cat "$SEQ/$attempt.exit" 2>/dev/null || echo 0)
""",
    "squeue": "echo held\n",
    "scontrol": """
if [ "$1 $2" = "show hostnames" ]; then cat "$SEQ/held"; else echo "scontrol $*" >> "$CALLS"; fi
""",
    "sinfo": "",  # no node down; the partition not known
}


def _run_task() -> None:  # what the ranks would run: the stand-in srun never starts them
    pass


def _attempt(seq: Path, n: int, exit: int = 1, stderr: str = "", **left) -> None:
    """Attempt `n` ends with `exit`, srun saying `stderr`; `left`: died (a rank's death
    record), hang (a watchdog's record), held (the job's nodes after it)."""
    (seq / f"{n}.exit").write_text(str(exit))
    (seq / f"{n}.stderr").write_text(stderr + "\n" if stderr else "")
    for name, value in left.items():
        text = "\n".join(value) if name == "held" else json.dumps(value)
        (seq / f"{n}.{name}").write_text(text + "\n")


def _died(step: int) -> dict:
    return {"kind": "crash", "rank": 1, "node": "n2", "step": step, "at": 1.0, "error": "E: x"}


@pytest.fixture
def job(tmp_path, monkeypatch):
    """A job holding n1, n2, n3 whose attempts run on two of them (one spare)."""
    bin_dir, seq = tmp_path / "bin", tmp_path / "seq"
    bin_dir.mkdir()
    seq.mkdir()
    for name, body in FAKES.items():
        script = bin_dir / name
        script.write_text("#!/bin/sh\n" + body)
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    (seq / "held").write_text("n1\nn2\nn3\n")
    paths = RunPaths.of(tmp_path / "run")
    paths.progress.mkdir(parents=True)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    for name, value in [("SEQ", seq), ("CALLS", tmp_path / "calls"), ("PROGRESS", paths.progress)]:
        monkeypatch.setenv(name, str(value))
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    monkeypatch.delenv("SLURM_JOB_PARTITION", raising=False)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR2)}
    yield seq, paths, tmp_path / "calls"
    for s, handler in handlers.items():
        signal.signal(s, handler)


def _supervise(paths: RunPaths, max_restarts: int = 3, max_requeues: int = 3) -> None:
    attempts = Attempts(
        workdir=str(paths.root),
        logs=str(paths.job_logs("train")),
        nodes=2,
        tasks_per_node=1,
        gpus_per_node=0,
        cpus_per_task=1,
        srun_args=(),
        limits=Limits(max_restarts, max_requeues),
    )
    Supervisor(_run_task, attempts)()


def _recorded(paths: RunPaths) -> list[FaultRecord]:
    lines = paths.failures_log.read_text().splitlines()
    return [FaultRecord.from_json(json.loads(line)) for line in lines]


def _nodelists(calls: Path) -> list[str]:
    said = [w for line in calls.read_text().splitlines() for w in line.split()]
    return [w.split("=", 1)[1] for w in said if w.startswith("--nodelist=")]


def test_a_second_crash_on_a_node_swaps_it_for_the_spare_and_the_run_goes_on(job):
    seq, paths, calls = job
    _attempt(seq, 1, stderr=CRASH_N2, died=_died(14))
    _attempt(seq, 2, stderr=CRASH_N2, died=_died(27))
    _attempt(seq, 3, exit=0)
    _supervise(paths)
    first, second = _recorded(paths)
    assert (first.kind, first.ranks, first.nodes, first.step) == (FaultKind.CRASH, [1], ["n2"], 15)
    assert (first.decision, first.action, first.excluded) == (
        Action.RESTARTED,
        "restarted in the allocation",
        [],
    )
    assert (second.decision, second.excluded) == (Action.RESTARTED, ["n2"])
    assert second.action == "restarted in the allocation without n2"
    assert _nodelists(calls) == ["n1,n2", "n1,n2", "n1,n3"]
    assert "scontrol" not in calls.read_text()  # nothing asked of Slurm but the nodes


def test_the_same_crash_at_the_same_step_stops_the_job_in_one_line(job, capsys):
    seq, paths, calls = job
    _attempt(seq, 1, stderr=CRASH_N2, died=_died(14))
    _attempt(seq, 2, stderr=CRASH_N2, died=_died(14))
    with pytest.raises(SystemExit) as stopped:
        _supervise(paths)
    assert stopped.value.code == 1
    first, second = _recorded(paths)
    assert first.decision is Action.RESTARTED and second.decision is Action.STOPPED
    stop = "stopped: a crash at step 15 again after a restart, which made no progress"
    assert second.action == stop
    said = capsys.readouterr().err
    assert said.count(stop) == 1 and "Traceback" not in said
    assert _nodelists(calls) == ["n1,n2", "n1,n2"]


def test_a_node_lost_restarts_on_the_spare_then_a_hang_with_none_left_requeues(job):
    seq, paths, calls = job
    _attempt(seq, 1, stderr="srun: error: n2: task 1: Killed", held=["n1", "n3"])
    hang = FaultRecord(FaultKind.HANG, attempt=2, step=31, ranks=[0], nodes=["n3"], line="h")
    _attempt(seq, 2, hang=hang.to_json())
    _supervise(paths)
    lost, hung = _recorded(paths)
    assert (lost.kind, lost.nodes, lost.decision) == (FaultKind.NODE_LOST, ["n2"], Action.RESTARTED)
    assert lost.action == "restarted in the allocation without n2"
    assert (hung.kind, hung.attempt, hung.decision) == (FaultKind.HANG, 2, Action.REQUEUED)
    assert hung.action == "requeued without n3 (no spare node left)"
    assert _nodelists(calls) == ["n1,n2", "n1,n3"]
    asked = [line for line in calls.read_text().splitlines() if line.startswith("scontrol")]
    assert asked == [
        "scontrol requeuehold 7",
        "scontrol update JobId=7 ExcNodeList=n2,n3",
        "scontrol release 7",
    ]


def test_out_of_memory_is_never_retried_and_max_requeues_stops_a_requeue(job, monkeypatch):
    seq, paths, _ = job
    oom = {**_died(3), "kind": "out of memory", "error": "OutOfMemoryError: CUDA"}
    _attempt(seq, 1, stderr=CRASH_N2, died=oom)
    with pytest.raises(SystemExit):
        _supervise(paths)
    (record,) = _recorded(paths)
    assert record.decision is Action.STOPPED and record.action.startswith("stopped, not retried")

    paths.failures_log.unlink()
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")  # requeued twice already
    _attempt(seq, 2, stderr=CRASH_N2, died=_died(9))
    with pytest.raises(SystemExit):
        _supervise(paths, max_restarts=0, max_requeues=2)
    (record,) = _recorded(paths)
    assert record.action == "stopped: 2 requeues reached resilience.max_requeues"
