"""Where and how the jobs run (cluster.*): local or Slurm, resources, job scripts, and the
machine model the planner reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.config import choices as c
from pipeline.config import rules as r
from pipeline.config.keys import command
from pipeline.config.rules import AT_LEAST_ONE, NOT_NEGATIVE, POSITIVE


@dataclass
class ClusterConfig:
    name: c.ClusterName = command(c.ClusterName.local, "local or slurm")
    executor: c.Executor = command(c.Executor.inprocess, "local: inprocess | subprocess")
    nodes: int = command(1, "nodes of the training job", rule=AT_LEAST_ONE, common=True)
    gpus_per_node: int = command(0, "GPUs per node", rule=NOT_NEGATIVE, common=True)
    tasks_per_node: int | None = command(
        None, "training ranks per node; none: one per GPU", rule=AT_LEAST_ONE
    )
    cpus_per_task: int = command(2, "CPUs per task", rule=AT_LEAST_ONE)
    mem_gb: int | None = command(None, "memory per node", rule=AT_LEAST_ONE)
    partition: str | None = command(None, "the Slurm partition", script=True, common=True)
    cpu_partition: str | None = command(
        None, "for tokenizer, tokenize and verify jobs; none: partition", script=True
    )
    account: str | None = command(None, "the Slurm account", script=True, common=True)
    qos: str | None = command(None, "the Slurm QOS", script=True)
    time_limit: str = command("04:00:00", "of GPU jobs", rule=r.SLURM_TIME, common=True)
    cpu_time_limit: str = command("02:00:00", "of CPU jobs", rule=r.SLURM_TIME)
    array_parallelism: int = command(64, "tokenize tasks at once", rule=AT_LEAST_ONE)
    setup: list[str] = command(help="shell lines each job runs first", factory=list)
    sbatch_extra: dict[str, Any] = command(
        help="more #SBATCH options", factory=dict, rule=r.SBATCH_OPTIONS, script=True
    )
    env: dict[str, str] = command(
        help="exported in each job script (NCCL_SOCKET_IFNAME, ...)",
        factory=dict,
        rule=r.ENVIRONMENT,
        script=True,
    )
    srun_args: list[str] = command(
        help="more options of the tasks' srun", factory=list, script=True
    )
    # pyxis/enroot: srun --container-image, --container-mounts
    container_image: str | None = command(None, "a container for the tasks", script=True)
    container_mounts: list[str] = command(
        help="SRC:DST[:FLAGS]", factory=list, rule=r.MOUNTS, script=True
    )
    gpu: str | None = command(None, "GPU model, e.g. H100: peak FLOP/s, memory and fp8")
    gpu_memory_gb: float | None = command(None, "none: that of cluster.gpu, when known")
    # The planner's machine model (pipeline.planning.hardware); none: cluster.gpu's preset
    peak_tflops: float | None = command(
        None, "dense bf16 peak per GPU, TFLOP/s (fp8: twice this)", rule=POSITIVE
    )
    hbm_gbps: float | None = command(None, "GPU memory bandwidth, GB/s", rule=POSITIVE)
    nvlink_gbps: float | None = command(
        None, "NVLink bandwidth per GPU and direction, GB/s", rule=POSITIVE
    )
    network_gbps: float | None = command(
        None, "network bandwidth per GPU and direction, GB/s", rule=POSITIVE
    )
    nvlink_domain: int | None = command(
        None, "GPUs joined by NVLink; none: a node (72 for GB200)", rule=AT_LEAST_ONE
    )
    checkpoint_write_gbps: float = command(
        1.0, "the checkpoint filesystem's write GB/s", rule=POSITIVE
    )
    rendezvous_timeout_s: float = command(300.0, "a rank's wait for every rank to start")
