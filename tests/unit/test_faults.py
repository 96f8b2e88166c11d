"""What ended a training attempt, told from what it left: a watchdog's hang record, a node
gone from the job, a rank's own record of its death (out of memory apart), srun's lines."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.paths import RunPaths
from pipeline.resilience import faults, progress
from pipeline.resilience.records import FaultKind, FaultRecord
from pipeline.runtime import placement

SRUN = "srun: error: n2: task 1: Exited with exit code 1\nsrun: error: n1: task 0: Killed\n"


def _attempt(tmp_path: Path) -> RunPaths:
    paths = RunPaths.of(tmp_path)
    for rank, node in enumerate(["n1", "n2"]):
        reporter = progress.Reporter(paths.progress, rank)
        reporter.node = node
        reporter.step_took(0.5)
        reporter.phase("forward-backward", 14)
    return paths


def _log(tmp_path: Path):
    log = tmp_path / "rank1.err"
    log.write_text("step 14\nTraceback (most recent call last):\n  ...\nValueError: bad row\n")
    return lambda rank: log if rank == 1 else tmp_path / "none"


def test_a_crash_srun_reports_names_the_first_rank_and_quotes_its_log(tmp_path):
    paths = _attempt(tmp_path)
    fault = faults.diagnose(paths, SRUN, ["n1", "n2"], ["n1", "n2"], _log(tmp_path), 2).to_json()
    assert fault["kind"] == "crash" and fault["ranks"] == [1] and fault["nodes"] == ["n2"]
    assert fault["step"] == 15 and fault["attempt"] == 2
    assert fault["last_lines"][-1] == "ValueError: bad row"
    assert fault["line"] == "crash: rank(s) 1 on n2 in step 15: Exited with exit code 1"


def test_a_rank_s_own_record_wins_and_tells_out_of_memory_apart(tmp_path):
    paths = _attempt(tmp_path)
    error = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate")
    faults.write_death(paths.progress, 1, 14, error)
    fault = faults.diagnose(paths, SRUN, ["n1", "n2"], ["n1", "n2"], _log(tmp_path), 1).to_json()
    assert fault["kind"] == "out of memory" and fault["ranks"] == [1] and fault["step"] == 15
    assert "last_lines" not in fault and "can't allocate memory" in fault["line"]
    faults.clear(paths.progress)
    assert not list(paths.progress.glob("died-*"))


def test_a_node_gone_from_the_job_is_lost_and_a_hang_record_comes_first(tmp_path):
    paths = _attempt(tmp_path)
    fault = faults.diagnose(paths, SRUN, ["n1", "n2"], ["n1"], _log(tmp_path), 1).to_json()
    assert fault["kind"] == "node lost" and fault["nodes"] == ["n2"] and fault["ranks"] == [1]
    hang = FaultRecord(FaultKind.HANG, attempt=2, step=9, ranks=[1], nodes=["n2"], line="hang")
    faults.write_finding(paths.progress, "n2", hang)
    found = faults.diagnose(paths, SRUN, ["n1", "n2"], ["n1"], _log(tmp_path), 3).to_json()
    assert (found["kind"], found["nodes"], found["step"], found["attempt"]) == (
        "hang",
        ["n2"],
        9,
        3,
    )


def test_attempts_are_counted_across_restarts(tmp_path):
    counter = tmp_path / "attempts"
    assert [faults.next_attempt(counter) for _ in range(3)] == [1, 2, 3]


def test_a_rank_killed_by_a_signal_is_the_fault_not_the_peer_whose_collective_broke(tmp_path):
    paths = _attempt(tmp_path)
    faults.write_death(paths.progress, 0, 14, RuntimeError("Connection closed by peer"))
    killed = "srun: error: n2: task 1: Killed\nsrun: error: n1: task 0: Exited with exit code 1\n"
    fault = faults.diagnose(paths, killed, ["n1", "n2"], ["n1", "n2"], _log(tmp_path), 1).to_json()
    assert fault["ranks"] == [1] and fault["nodes"] == ["n2"] and fault["kind"] == "crash"
    assert fault["line"] == "crash: rank(s) 1 on n2 in step 15: Killed"


def test_a_rank_that_stopped_the_run_on_purpose_is_not_taken_for_a_crash(tmp_path):
    from pipeline.core.errors import NonFinite

    paths = _attempt(tmp_path)
    faults.write_death(paths.progress, 0, 14, NonFinite("10 steps skipped in a row"))
    fault = faults.diagnose(paths, SRUN, ["n1", "n2"], ["n1", "n2"], _log(tmp_path), 1).to_json()
    assert fault["kind"] == "stopped" and fault["ranks"] == [0]
    node = placement.node_name()  # where the rank died: this machine
    expected = f"stopped: rank 0 on {node} in step 15: NonFinite: 10 steps skipped in a row"
    assert fault["line"] == expected
