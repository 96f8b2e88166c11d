"""cluster.executor=slurm: every step submitted at once through submitit, each held by an
`afterok` dependency on the one before, so the chain runs unattended and a failure cancels
what depends on it (--kill-on-invalid-dep=yes). The only module that submits to Slurm; what
else is asked of Slurm goes through pipeline.resilience.scheduler."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from pipeline.config import PipelineConfig
from pipeline.config.derived import slurm_minutes
from pipeline.core import log
from pipeline.core.paths import RunPaths
from pipeline.core.steps import Placement
from pipeline.orchestration import slurm_queue
from pipeline.orchestration.executors.base import resources
from pipeline.orchestration.graph import Step
from pipeline.orchestration.tasks import ArrayTask, DistributedTask, ScoreTask
from pipeline.resilience.decisions import Limits
from pipeline.resilience.supervisor import Attempts, Supervisor

_log = log.get("pipeline")


def srun_args(cfg: PipelineConfig) -> list[str]:
    """What the tasks' srun gets beyond submitit's own: the container (pyxis), then the site's."""
    c = cfg.cluster
    args = []
    if c.container_image:
        args.append(f"--container-image={c.container_image}")
    if c.container_mounts:
        args.append(f"--container-mounts={','.join(c.container_mounts)}")
    return [*args, *c.srun_args]


def supervisor(cfg: PipelineConfig, step: Step) -> Supervisor:
    """What a training job runs: its ranks' task, started and restarted by the supervisor."""
    needs = resources(step, cfg)
    attempts = Attempts(
        workdir=str(cfg.workdir),
        logs=str(RunPaths.of(cfg.workdir).job_logs(step.name)),
        nodes=needs.nodes,
        tasks_per_node=needs.tasks_per_node,
        gpus_per_node=needs.gpus_per_node,
        cpus_per_task=cfg.cluster.cpus_per_task,
        srun_args=tuple(srun_args(cfg)),
        limits=Limits(cfg.resilience.max_restarts, cfg.resilience.max_requeues),
    )
    return Supervisor(DistributedTask(step, cfg), attempts)


def slurm_parameters(cfg: PipelineConfig, step: Step) -> dict[str, Any]:
    """sbatch options for one step: its resources from its placement, the rest from
    conf/cluster."""
    c = cfg.cluster
    needs = resources(step, cfg)
    extra = {"kill-on-invalid-dep": "yes", **dict(c.sbatch_extra)}
    extra.update({key: getattr(c, key) for key in ("account", "qos") if getattr(c, key)})
    on_gpus = needs.gpus_per_node > 0
    params = dict(
        job_name=f"pretrain-{step.name}",
        partition=c.partition if on_gpus or not c.cpu_partition else c.cpu_partition,
        nodes=needs.nodes,
        ntasks_per_node=needs.tasks_per_node,
        cpus_per_task=c.cpus_per_task,
        gpus_per_node=needs.gpus_per_node or None,
        mem=f"{c.mem_gb}G" if c.mem_gb else None,
        time=slurm_minutes(needs.time_limit, "cluster.time_limit"),
        setup=[*c.setup, *(f"export {k}={shlex.quote(str(v))}" for k, v in c.env.items())],
        srun_args=srun_args(cfg) or None,
        array_parallelism=c.array_parallelism,
        additional_parameters=extra,
    )
    if needs.requeue:
        # Slurm signals every task this long before the time limit; the loop saves and requeues.
        params["signal_delay_s"] = cfg.resilience.exit_signal_lead_s
        extra["requeue"] = True
    if step.placement is Placement.TRAINING_RANKS:
        # the supervisor starts the ranks itself, on some of the nodes: the others are spares,
        # and a node lost leaves the job (--no-kill) instead of ending it
        params.update(nodes=needs.nodes + cfg.resilience.spare_nodes, use_srun=False)
        extra["no-kill"] = True
    return {k: v for k, v in params.items() if v is not None}


def _executor(cfg: PipelineConfig, step: Step, after: str | None, submits: bool = True):
    """submitit's executor for `step`; one that only renders its script (`submits=False`, a
    dry run) needs no Slurm on this machine (submitit's own refuses to start without srun)."""
    import submitit

    kind = submitit.SlurmExecutor if submits else _script_writer()
    executor = kind(folder=str(RunPaths.of(cfg.workdir).job_logs(step.name)))
    params = slurm_parameters(cfg, step)
    if after:
        params["additional_parameters"]["dependency"] = f"afterok:{after}"
    if step.placement is Placement.ARRAY:
        params["array_parallelism"] = min(step.tasks(cfg), cfg.cluster.array_parallelism)
    executor.update_parameters(**params)
    return executor


def _script_writer() -> type:
    import submitit

    class ScriptWriter(submitit.SlurmExecutor):
        @classmethod
        def affinity(cls) -> int:  # what submitit checks for srun; rendering never runs it
            return 1

    return ScriptWriter


def script(cfg: PipelineConfig, step: Step, after: str | None) -> str:
    """The sbatch script submitit would write for `step`, `after` the job it depends on."""
    executor = _executor(cfg, step, after, submits=False)
    # submitit writes the script only as it submits: its own renderer, with a placeholder id
    text = executor._make_submission_file_text(executor._submitit_command_str, "<id>")
    if step.placement is Placement.ARRAY:  # submitit adds --array as it submits, too
        tasks = step.tasks(cfg)
        parallelism = min(tasks, cfg.cluster.array_parallelism)
        text = text.replace(
            "#SBATCH --job-name",
            f"#SBATCH --array=0-{tasks - 1}%{parallelism}\n#SBATCH --job-name",
            1,
        )
    return text


class SlurmExecutor:
    name = "slurm"

    def run(self, steps: list[Step], cfg: PipelineConfig) -> None:
        paths = RunPaths.of(cfg.workdir)
        slurm_queue.record_submission(paths, self.submit(steps, cfg))

    def submit(self, steps: list[Step], cfg: PipelineConfig) -> dict[str, list[str]]:
        """Every step at once, each held by `afterok` on the one before; returns job ids. A
        rerun never submits a step twice: it chains onto a job still queued or running."""
        submitted: dict[str, list[str]] = {}
        previous: str | None = None
        active = slurm_queue.active_jobs(RunPaths.of(cfg.workdir))
        for step in steps:
            if step.name in active:
                submitted[step.name] = active[step.name]
                previous = active[step.name][0].split("_")[0]
                _log.info(
                    f"{step.name}: job {previous} is still queued or running; not resubmitted"
                )
                continue
            executor = _executor(cfg, step, previous)
            if step.placement is Placement.ARRAY:
                array = executor.map_array(ArrayTask(step, cfg), range(step.tasks(cfg)))
                ids = [job.job_id for job in array]
                previous = ids[0].split("_")[0]
            else:
                training = step.placement is Placement.TRAINING_RANKS
                task = supervisor(cfg, step) if training else None
                job = executor.submit(task or DistributedTask(step, cfg))
                ids = [job.job_id]
                previous = job.job_id
            submitted[step.name] = ids
            tasks = f" ({len(ids)} array tasks)" if step.placement is Placement.ARRAY else ""
            _log.info(f"{step.name}: submitted job {previous}{tasks}")
        return submitted


def submit_scoring(cfg: PipelineConfig, folder: Path) -> str:
    """A job of the downstream step's resources that scores the checkpoint `folder`, with no
    dependency (the training that saved it goes on); returns its id."""
    from pipeline.evaluation.downstream_step import DOWNSTREAM

    executor = _executor(cfg, DOWNSTREAM, None)
    executor.update_parameters(job_name=f"pretrain-downstream-{folder.name}")
    return executor.submit(ScoreTask(cfg, str(folder))).job_id
