"""Running the job graph: in this process, in local subprocesses (submitit's local executor),
or on Slurm. The only module that talks to submitit."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import subprocess
import sys
import time

from omegaconf import DictConfig

from pipeline import files
from pipeline.config import slurm_minutes
from pipeline.errors import StageError
from pipeline.graph import Step
from pipeline.layout import RunLayout


def _say(text: str) -> None:
    print(f"[pipeline] {text}", file=sys.stderr, flush=True)


def _stop_if_interrupted(step: Step, result) -> None:
    """A step that saved and stopped on a signal ends the chain here: the steps after it must
    not run on its unfinished outputs (evaluating a half-trained model, say)."""
    if isinstance(result, dict) and result.get("status") == "interrupted":
        raise StageError(
            f"{step.name}: stopped by a signal at step {result.get('step')} after saving; "
            "rerun the same command to resume"
        )


def _local_workers(cfg: DictConfig, tasks: int) -> int:
    return max(1, min(tasks, (os.cpu_count() or 1) // max(1, cfg.cluster.cpus_per_task)))


def _run_array_inprocess(step: Step, cfg: DictConfig) -> None:
    workers = _local_workers(cfg, step.array)
    if workers == 1:
        for index in range(step.array):
            step.run(cfg, index)
        return
    context = multiprocessing.get_context("spawn")  # no fork after torch and threads exist
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        for future in [pool.submit(step.run, cfg, i) for i in range(step.array)]:
            future.result()


def run_inprocess(steps: list[Step], cfg: DictConfig) -> None:
    for step in steps:
        started = time.time()
        _say(f"{step.name}: running" + (f" ({step.array} tasks)" if step.array else ""))
        if step.array:
            _run_array_inprocess(step, cfg)
        else:
            if step.ranks > 1:
                raise ValueError(
                    f"{step.name} needs {step.ranks} processes: use cluster.executor=subprocess "
                    "or cluster=slurm"
                )
            _stop_if_interrupted(step, step.run(cfg))
        _say(f"{step.name}: done in {time.time() - started:.1f} s")


def _local_executor(cfg: DictConfig, step: Step):
    import submitit

    folder = RunLayout.of(cfg.workdir).logs / "jobs" / step.name / "%j"
    executor = submitit.LocalExecutor(folder=str(folder))
    executor.update_parameters(
        timeout_min=24 * 60, tasks_per_node=step.ranks, gpus_per_node=step.gpus_per_node
    )
    return executor


def _results(step: Step, job) -> list:
    """A local job's results; a failed job is reported in one line: its error, and its log."""
    from submitit.core.utils import FailedJobError

    try:
        return job.results()
    except FailedJobError as e:
        parts = str(e).split("-" * 22)  # submitit quotes the job's traceback between rules
        last = parts[1].strip().splitlines()[-1] if len(parts) > 2 else str(e).splitlines()[0]
        raise StageError(f"{step.name} failed: {last} (log: {job.paths.stderr})") from None


def run_subprocess(steps: list[Step], cfg: DictConfig) -> None:
    """Each step as its own job of submitit's local executor, one after the other."""
    from pipeline import jobs

    for step in steps:
        started = time.time()
        executor = _local_executor(cfg, step)
        if step.array:
            executor.update_parameters(tasks_per_node=1)
            submitted = executor.map_array(jobs.ArrayTask(step.run, cfg), range(step.array))
        else:
            submitted = [executor.submit(jobs.DistributedTask(step.run, cfg))]
        _say(f"{step.name}: {len(submitted)} job(s), logs under {submitted[0].paths.folder}")
        for job in submitted:
            _stop_if_interrupted(step, _results(step, job)[0])
        _say(f"{step.name}: done in {time.time() - started:.1f} s")


def slurm_parameters(cfg: DictConfig, step: Step) -> dict:
    """sbatch options for one step: its resources from the graph, the rest from conf/cluster."""
    c = cfg.cluster
    extra = {"kill-on-invalid-dep": "yes", **dict(c.sbatch_extra)}
    extra.update({key: c[key] for key in ("account", "qos") if c[key]})
    on_gpus = step.gpus_per_node > 0
    params = dict(
        job_name=f"pretrain-{step.name}",
        partition=c.partition if on_gpus or not c.cpu_partition else c.cpu_partition,
        nodes=step.nodes,
        ntasks_per_node=step.tasks_per_node,
        cpus_per_task=c.cpus_per_task,
        gpus_per_node=step.gpus_per_node or None,
        mem=f"{c.mem_gb}G" if c.mem_gb else None,
        time=slurm_minutes(step.time_limit, "cluster.time_limit"),
        setup=list(c.setup),
        array_parallelism=c.array_parallelism,
        additional_parameters=extra,
    )
    if step.requeue:
        # Slurm signals every task this long before the time limit; the loop saves and requeues.
        params["signal_delay_s"] = cfg.train.exit_signal_lead_s
        extra["requeue"] = True
    return {k: v for k, v in params.items() if v is not None}


def slurm_states(job_ids: list[str]) -> dict[str, tuple[str, str]]:
    """job id -> (state, reason) from sacct, falling back to squeue for jobs sacct lacks."""
    states: dict[str, tuple[str, str]] = {}
    ids = ",".join(sorted({j.split("_")[0] for j in job_ids}))
    try:
        out = subprocess.run(
            ["sacct", "-n", "-P", "-X", "-j", ids, "-o", "JobID,State,Reason"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        for line in out.splitlines():
            job, state, *reason = line.split("|")
            states[job] = (state.split()[0], reason[0] if reason else "")
        out = subprocess.run(
            ["squeue", "-h", "-j", ids, "-o", "%i|%T|%r"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        for line in out.splitlines():
            job, state, reason = line.split("|")
            states.setdefault(job, (state, reason))
    except (OSError, subprocess.TimeoutExpired):
        pass
    for job in job_ids:  # array tasks that never started are listed together, as ID_[0-3]
        base = job.split("_")[0] + "_["
        grouped = next((v for k, v in states.items() if k.startswith(base)), None)
        if job not in states and grouped:
            states[job] = grouped
    return states


ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING"}


def active_jobs(cfg: DictConfig) -> dict[str, list[str]]:
    """Steps of the latest submission whose jobs are still queued or running."""
    history = files.read_json_or_none(RunLayout.of(cfg.workdir).jobs) or []
    if not history:
        return {}
    latest = history[-1]["jobs"]
    states = slurm_states([j for ids in latest.values() for j in ids])
    return {
        step: ids
        for step, ids in latest.items()
        if any(states.get(j, ("", ""))[0] in ACTIVE for j in ids)
    }


def submit_slurm(steps: list[Step], cfg: DictConfig) -> dict[str, list[str]]:
    """Submit every step at once, each held by `afterok` on the one before; returns job ids."""
    import submitit

    from pipeline import jobs

    layout = RunLayout.of(cfg.workdir)
    submitted: dict[str, list[str]] = {}
    previous: str | None = None
    active = active_jobs(cfg)
    for step in steps:
        if step.name in active:  # a rerun never submits a step twice: chain onto the live job
            submitted[step.name] = active[step.name]
            previous = active[step.name][0].split("_")[0]
            _say(f"{step.name}: job {previous} is still queued or running; not resubmitted")
            continue
        executor = submitit.SlurmExecutor(folder=str(layout.logs / "jobs" / step.name / "%j"))
        params = slurm_parameters(cfg, step)
        if previous:
            params["additional_parameters"]["dependency"] = f"afterok:{previous}"
        executor.update_parameters(**params)
        if step.array:
            array = executor.map_array(jobs.ArrayTask(step.run, cfg), range(step.array))
            ids = [job.job_id for job in array]
            previous = ids[0].split("_")[0]
        else:
            job = executor.submit(jobs.DistributedTask(step.run, cfg))
            ids = [job.job_id]
            previous = job.job_id
        submitted[step.name] = ids
        _say(
            f"{step.name}: submitted job {previous}"
            + (f" ({len(ids)} array tasks)" if step.array else "")
        )
    return submitted


def describe_graph(steps: list[Step], cfg: DictConfig) -> str:
    """The chain of jobs as one line, e.g. tokenizer -> tokenize[4 tasks] -> ... -> evaluate."""

    def one(step: Step) -> str:
        what = [f"{step.array} tasks"] if step.array else []
        if step.ranks > 1 or step.gpus_per_node:
            what.append(f"{step.nodes} node(s) x {step.tasks_per_node} task(s)")
        if step.gpus_per_node:
            what.append(f"{step.gpus_per_node} GPU(s)/node")
        return step.name + (f"[{', '.join(what)}]" if what else "")

    return " -(afterok)-> ".join(one(s) for s in steps) or "(nothing to do)"


def dry_run(steps: list[Step], cfg: DictConfig) -> None:
    """Print the dependency graph and, on Slurm, each sbatch script; submit nothing."""
    import submitit

    print(f"Job graph: {describe_graph(steps, cfg)}")
    if cfg.cluster.executor != "slurm":
        return
    for index, step in enumerate(steps):
        folder = RunLayout.of(cfg.workdir).logs / "jobs" / step.name / "%j"
        executor = submitit.SlurmExecutor(folder=str(folder))
        params = slurm_parameters(cfg, step)
        if index:
            params["additional_parameters"]["dependency"] = f"afterok:<{steps[index - 1].name} job>"
        if step.array:
            params["array_parallelism"] = min(step.array, cfg.cluster.array_parallelism)
        executor.update_parameters(**params)
        script = executor._make_submission_file_text(executor._submitit_command_str, "<id>")
        if step.array:
            script = script.replace(
                "#SBATCH --job-name",
                f"#SBATCH --array=0-{step.array - 1}%"
                f"{params['array_parallelism']}\n#SBATCH --job-name",
                1,
            )
        print(f"\n# ---- {step.name} ----\n{script}")


def run(steps: list[Step], cfg: DictConfig) -> None:
    if cfg.dry_run:
        dry_run(steps, cfg)
        return
    if cfg.cluster.executor == "inprocess":
        run_inprocess(steps, cfg)
    elif cfg.cluster.executor == "subprocess":
        run_subprocess(steps, cfg)
    else:
        submitted = submit_slurm(steps, cfg)
        jobs_file = RunLayout.of(cfg.workdir).jobs
        history = files.read_json_or_none(jobs_file) or []
        history.append({"submitted": time.strftime("%Y-%m-%dT%H:%M:%S"), "jobs": submitted})
        files.write_json(jobs_file, history)
