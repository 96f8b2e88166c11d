"""Each step's state, from its completion marker and what it records it was made from, and,
for submitted jobs, from Slurm: COMPLETE, RUNS AGAIN (and why), REFUSED (and why), PENDING,
RUNNING (a Slurm job, or the launcher that holds the run folder here, with its pid), FAILED
(with why: Slurm's reason, or the error of a local run), NOT RUN."""

from __future__ import annotations

import shlex
import time

from pipeline.config import PipelineConfig
from pipeline.core import files, lock
from pipeline.core.paths import RunPaths
from pipeline.orchestration import graph, reruns
from pipeline.orchestration.slurm_queue import FAILED, latest_submission, slurm_states
from pipeline.reporting.summary import read_failures, read_router_health, read_stragglers
from pipeline.resilience import progress
from pipeline.runtime import placement
from pipeline.training import leases

STATES = {
    "complete": "COMPLETE",
    "incomplete": "INCOMPLETE",
    "continue": "CONTINUES",
    "redo": "REDONE",
    "forced": "REDONE",
    "refuse": "REFUSED",
    "new": "NOT RUN",
}


def describe(cfg: PipelineConfig) -> list[tuple[str, str, str]]:
    """(step, state, detail) for every step of the run's stages."""
    paths = RunPaths.of(cfg.workdir)
    verdicts = {v.step.name: v for v in reruns.judge(cfg)}
    latest = latest_submission(paths)
    states = slurm_states([j for ids in latest.values() for j in ids]) if latest else {}
    live = lock.holder(paths.root)  # a launcher running the steps here, this moment
    running = None
    rows = []
    failed_before = None
    for step in graph.steps(cfg):
        verdict = verdicts[step.name]
        ids = latest.get(step.name, [])
        failure = files.read_json_or_none(paths.failure(step.name))
        if verdict.state == "complete":
            done = "marker present, made from these settings"
            rows.append(
                (step.name, "COMPLETE", done + (_faults(paths) if step.name == "train" else ""))
            )
            continue
        if live and not ids:  # run by that launcher: the first step it has not completed
            if running is None:
                running = step.name
                at = ""
                if step.name == "train":
                    at = _training_step(cfg, _since(live)) + _router(paths)
                rows.append((step.name, "RUNNING", _launcher(live) + at))
            else:
                rows.append((step.name, "PENDING", f"runs after {running} in that launcher"))
            continue
        if verdict.differences:
            rows.append((step.name, STATES[verdict.state], verdict.describe()))
            continue
        if failure is not None and not ids:
            rows.append((step.name, "FAILED", f"{failure['error']} ({failure['at']})"))
            failed_before = failed_before or step.name
            continue
        if not ids:
            rows.append((step.name, STATES[verdict.state], f"run {rerun_command(paths)} to run it"))
            continue
        job_states = [states.get(j, ("UNKNOWN", "")) for j in ids]
        names = sorted({s for s, _ in job_states})
        bad = [
            f"{j}: {s} {r}".strip()
            for j, (s, r) in zip(ids, job_states, strict=True)
            if s in FAILED
        ]
        detail = f"job {ids[0].split('_')[0]}" + (f", {len(ids)} tasks" if len(ids) > 1 else "")
        if bad:
            detail += "; " + "; ".join(bad[:3])
            if failed_before and any(s == "CANCELLED" for s, _ in job_states):
                detail += f" (cancelled because {failed_before} failed)"
            failed_before = failed_before or step.name
        elif "PENDING" in names and failed_before:
            detail += f" (waits on {failed_before}, which failed)"
        if step.name == "train" and "RUNNING" in names:
            detail += _where_training_runs(paths) + _training_step(cfg, None)
        if step.name == "train":
            detail += _faults(paths)
        rows.append((step.name, "/".join(names), detail))
    return rows + scoring_rows(paths)


def scoring_rows(paths: RunPaths) -> list[tuple[str, str, str]]:
    """A row for each checkpoint scored, or being scored, on the downstream tasks: RUNNING
    (its lease's job is alive), DONE (its scores), FAILED (its job's error, or its job ended
    without scores)."""
    names = {p.name for p in paths.checkpoints.glob("iter_*") if (p / leases.LEASE).exists()}
    names |= {p.stem for p in paths.downstream_dir.glob("iter_???????.json")}
    names |= {p.name.split(".")[0] for p in paths.downstream_dir.glob("iter_*.failed.json")}
    rows = []
    for name in sorted(names):
        folder, row = paths.checkpoints / name, f"downstream {name}"
        lease = files.read_json_or_none(folder / leases.LEASE) if folder.is_dir() else None
        failure = files.read_json_or_none(paths.downstream_failure(name))
        result = files.read_json_or_none(paths.downstream_result(name))
        if lease is not None and leases.holder(folder) is not None:
            job = f"job {lease['job']}" if lease.get("job") else f"pid {lease.get('pid')}"
            rows.append((row, "RUNNING", f"{job} on {lease.get('host')}"))
        elif failure is not None:
            rows.append((row, "FAILED", f"{failure['error']} ({failure['at']})"))
        elif result is not None:
            tasks = ", ".join(sorted(result.get("tasks", {})))
            rows.append((row, "DONE", f"step {result.get('step')}: {tasks}"))
        else:
            log = paths.downstream_log(name)
            rows.append((row, "FAILED", f"its job ended without scores (log: {log})"))
    return rows


def rerun_command(paths: RunPaths) -> str:
    """The command that runs this run folder (its history gives the rest): `make pretrain`
    alone would run the default workdir, another folder."""
    return f"`make pretrain ARGS={shlex.quote(f'workdir={paths.root}')}`"


def _since(live: dict) -> float | None:
    """When the launcher took the run folder, as time.time() counts: to the sub-second (a
    report of the same second may come before or after), or from the local time a lock of
    0.6 holds."""
    if isinstance(live.get("started"), (int, float)):
        return float(live["started"])
    try:
        return time.mktime(time.strptime(str(live.get("since")), "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return None


def _training_step(cfg: PipelineConfig, since: float | None) -> str:
    """'; at step 12 of 20 (forward-backward)': the slowest rank's report (train/progress/),
    of this attempt when `since` says when it began; '' before a rank of it has reported."""
    reports = progress.read(RunPaths.of(cfg.workdir).progress)
    reports = [r for r in reports if since is None or r.at >= since]
    if not reports:
        return ""
    last = min(reports, key=lambda r: r.step)
    return f"; at step {last.step} of {cfg.train.steps} ({last.phase})"


def _launcher(live: dict) -> str:
    return (
        f"pid {live.get('pid')} on {live.get('host')} since {live.get('since')} "
        f"({live.get('command')})"
    )


def _where_training_runs(paths: RunPaths) -> str:
    """'; 4 ranks on 2 nodes: n1 (ranks 0-1), n2 (ranks 2-3), from step 40' (its latest attempt)."""
    record = files.read_json_or_none(paths.ranks)
    if not record or not record["attempts"]:
        return ""
    attempt = record["attempts"][-1]
    return f"; {placement.describe(attempt['ranks'])}, from step {attempt['from_step']}"


def _router(paths: RunPaths) -> str:
    """'; router at step 20: busiest expert 1.67x mean, 0 idle, 0.0% dropped; COLLAPSED layer
    3: ...' for a mixture of experts (train/metrics.jsonl); '' for a dense model."""
    r = read_router_health(paths)
    if r is None:
        return ""
    line = (
        f"; router at step {r['step']}: busiest expert {r['moe/max_over_mean']:.2f}x mean, "
        f"{r['moe/idle_experts']} idle, {100 * r['moe/dropped']:.1f}% dropped"
    )
    collapsed = r.get("moe_collapse", {})
    return line + "".join(f"; COLLAPSED layer {k}: {v}" for k, v in sorted(collapsed.items()))


def _faults(paths: RunPaths) -> str:
    """'; 1 fault(s), 23 s lost; last: hang of rank 1 on n2 at step 16, requeued without n2;
    stragglers: rank 3 on n2' (train/failures.jsonl, train/metrics.jsonl), and a mixture of
    experts' router health."""
    slow = {f"rank {s['rank']} on {s['node']}" for s in read_stragglers(paths)}
    named = f"; stragglers: {', '.join(sorted(slow))}" if slow else ""
    named += _router(paths)
    faults = read_failures(paths)
    if not faults:
        return named
    last = faults[-1]
    lost = sum(r["seconds_lost"] for r in faults)
    ranks = ",".join(map(str, last["ranks"]))
    return (
        f"; {len(faults)} fault(s), {lost:.0f} s lost; last: {last['kind']} of rank {ranks} on "
        f"{','.join(last['nodes'])} at step {last['step']}, {last['action']}{named}"
    )


def is_failed(state: str) -> bool:
    return state in FAILED or state in ("FAILED", "REFUSED")
