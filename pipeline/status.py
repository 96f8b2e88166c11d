"""`python -m pipeline.status workdir=...` (or `make status`): each step's state, from the
completion markers and, for submitted jobs, from Slurm."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from pipeline import config as config_schema
from pipeline import files
from pipeline.launch import slurm_states
from pipeline.layout import RunLayout

config_schema.register()

FAILED = {
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


def describe(cfg: DictConfig) -> list[tuple[str, str, str]]:
    """(step, state, detail) for every step of the run."""
    from pipeline import graph

    layout = RunLayout.of(cfg.workdir)
    submissions = files.read_json_or_none(layout.jobs) or []
    latest = submissions[-1]["jobs"] if submissions else {}
    states = slurm_states([j for ids in latest.values() for j in ids]) if latest else {}
    rows = []
    failed_before = None
    for step in graph.build(cfg, prepare=False):
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


@hydra.main(config_path="../conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    saved = RunLayout.of(cfg.workdir).config
    if saved.exists():  # the run's own config, not this command's defaults
        cfg = OmegaConf.load(saved)
    rows = describe(cfg)
    print(f"Run folder: {RunLayout.of(cfg.workdir).root}")
    width = max(len(r[0]) for r in rows)
    for name, state, detail in rows:
        print(f"  {name:<{width}}  {state:<12}  {detail}")
    if any(state in FAILED for _, state, _ in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
