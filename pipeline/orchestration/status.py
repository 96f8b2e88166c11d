"""Each step's state, from its completion marker and, for submitted jobs, from Slurm:
COMPLETE, PENDING, RUNNING, FAILED (with why), NOT SUBMITTED."""

from __future__ import annotations

from pipeline.config import PipelineConfig
from pipeline.core.paths import RunPaths
from pipeline.orchestration import graph
from pipeline.orchestration.slurm_queue import FAILED, latest_submission, slurm_states


def describe(cfg: PipelineConfig) -> list[tuple[str, str, str]]:
    """(step, state, detail) for every step of the run."""
    latest = latest_submission(RunPaths.of(cfg.workdir))
    states = slurm_states([j for ids in latest.values() for j in ids]) if latest else {}
    rows = []
    failed_before = None
    for step in graph.steps(cfg):
        if step.is_complete(cfg):
            rows.append((step.name, "COMPLETE", "marker present"))
            continue
        ids = latest.get(step.name, [])
        if not ids:
            rows.append((step.name, "NOT SUBMITTED", "run `make pretrain` to submit"))
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
        rows.append((step.name, "/".join(names), detail))
    return rows


def is_failed(state: str) -> bool:
    return state in FAILED
