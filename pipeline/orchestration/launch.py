"""`python -m pipeline`: check what the run needs, judge each step's existing output against
what it was made from (pipeline.orchestration.reruns), print the plan, then run or submit the
steps to run, holding the run folder's lock. A refused command writes nothing."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline import config
from pipeline.config import PipelineConfig
from pipeline.core import files, log
from pipeline.core.errors import ConfigError
from pipeline.core.lock import run_lock
from pipeline.core.paths import RunPaths
from pipeline.core.steps import Placement
from pipeline.exporting.steps import EXPORT
from pipeline.exporting.steps import folder as export_folder
from pipeline.orchestration import (
    executors,
    graph,
    history,
    partitions,
    reruns,
    slurm_queue,
    sweep,
    task_data,
)
from pipeline.orchestration.reruns import Verdict
from pipeline.planning import preflight, render, run_plan
from pipeline.planning.run_plan import Plan
from pipeline.tracking import settings as tracking_settings

_log = log.get("pipeline")

SHARED = ("corpus", "tokenizer", "data")  # what a run with data.prepared takes from another
SAID = {
    "incomplete": "resumes where it stopped",
    "continue": "continues from its output",
    "redo": "is redone",
    "forced": "is redone (force)",
}


def launch(cfg: PipelineConfig, given: list[str]) -> int:
    """Refuse what cannot work or would reuse outputs made otherwise, then run or submit the
    steps to run; print where it all went. `given`: this command line's overrides, recorded
    in runs.jsonl. A dry run prints what it would do, and writes nothing."""
    cfg, plan, fetch_tasks = refusals(cfg)
    verdicts = reruns.judge(cfg)
    reruns.refuse_changes(cfg, verdicts)
    if cfg.cluster.executor == "slurm" and not cfg.dry_run:
        problem = slurm_queue.slurm_problem()
        if problem:
            raise ConfigError(
                f"cluster: cluster={cfg.cluster.name} submits jobs to Slurm, but {problem}; run "
                "this on the cluster's login node, give cluster=local to run here, or "
                "dry_run=true to print the job scripts"
            )
        # a job no node can run: the queue would hold it forever
        partitions.check_fits(cfg, [v.step for v in verdicts if v.state in reruns.RUN])
    if cfg.dry_run:
        _run_pending(cfg, verdicts, plan, prepare=False)
        return 0
    paths = RunPaths.of(cfg.workdir)
    with run_lock(paths.root):  # one launcher per run folder
        moved = reruns.move_aside(cfg, verdicts)
        if moved:
            _log.info(f"force={cfg.force}: earlier outputs moved to {moved}")
        if cfg.data.prepared:
            _link_prepared_data(Path(cfg.data.prepared), paths)
        base = sweep.base_run() if sweep.is_multirun() else None
        if base is not None:
            sweep.record_point(paths)
        history.append(
            paths,
            history.for_run(paths, cfg.data.prepared, given, base),
            given,
            stages=list(cfg.stages),
            steps={v.step.name: v.state for v in verdicts},
        )
        files.write_text(paths.config, config.to_yaml(cfg))
        if fetch_tasks:  # once, before any job that reads it offline
            task_data.fetch(cfg)
        if plan is not None:
            run_plan.write(plan, paths.root)
        _run_pending(cfg, verdicts, plan, prepare=True)
    print(f"\nRun folder: {paths.root}")
    if paths.summary.exists():
        print(f"Summary:    {paths.summary}")
        print(paths.summary.read_text())
    if paths.report_html.exists():
        print(f"Report:     {paths.report_html} ({paths.report.name} beside it)")
    if "export" in cfg.stages and EXPORT.is_complete(cfg):
        print(f"Model:      {export_folder(cfg)} (Hugging Face format)")
    return 0


def refusals(cfg: PipelineConfig) -> tuple[PipelineConfig, Plan | None, bool]:
    """Refuse what cannot work or would fail after hours in the queue (raises ConfigError);
    `cfg` as its jobs are to run it (an MLflow store's local path made absolute), the plan
    of a run that trains, made once: checked here, then printed and kept in the run folder,
    and whether the downstream tasks' data is to be fetched (task_data.check)."""
    preflight.check_stage_inputs(cfg)
    cfg = tracking_settings.checked(cfg, Path.cwd())
    fetch_tasks = task_data.check(cfg)  # the inputs of the scoring jobs, before the plan
    plan = run_plan.make(cfg) if "train" in cfg.stages else None
    if plan is not None:
        preflight.check_training(cfg, plan)
        preflight.check_epochs(cfg, plan)
    return cfg, plan, fetch_tasks


def _link_prepared_data(prepared: Path, paths: RunPaths) -> None:
    """The prepared run's corpus, tokenizer and data folders, linked into this run."""
    source = prepared.expanduser().resolve()
    for name in SHARED:
        link = paths.root / name
        if not link.exists() and (source / name).exists():
            os.symlink(source / name, link)


def _run_pending(
    cfg: PipelineConfig, verdicts: list[Verdict], plan: Plan | None, prepare: bool
) -> None:
    if plan is not None:  # the plan, before anything is submitted
        for line in render.summary_lines(cfg, plan):
            log.get().info(line)  # the plan's lines, each opening with [plan]
    if prepare:  # cheap work that fixes the size of an array (the built-in corpus, shard plan)
        for step in graph.steps(cfg):
            if step.placement is Placement.ARRAY:
                step.prepare(cfg)
    running = {step.name for step in graph.steps(cfg)}
    state = {v.step.name: v for v in verdicts}
    done = [name for name in running if state[name].state == "complete"]
    if done:
        ordered = [s.name for s in graph.steps(cfg) if s.name in done]
        _log.info(f"already complete: {', '.join(ordered)}")
    for step in graph.steps(cfg):
        verdict = state[step.name]
        if verdict.state in SAID:
            why = f": {verdict.describe()}" if verdict.differences else ""
            _log.info(f"{step.name} {SAID[verdict.state]}{why}")
    todo = [step for step in graph.steps(cfg) if state[step.name].state in reruns.RUN]
    executors.select(cfg).run(todo, cfg)
