"""Refuse, before anything is submitted, a job that no node of its partition can ever run:
Slurm would keep it PENDING (PartitionConfig) forever while the launcher reported success.
What each node has is read with sinfo."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.config import PipelineConfig
from pipeline.core.errors import ConfigError
from pipeline.core.steps import Placement
from pipeline.orchestration.executors.slurm import slurm_parameters
from pipeline.orchestration.graph import Step
from pipeline.resilience import scheduler

# name, partition (the default one ends in *), CPUs, memory (MB), generic resources
SINFO_FORMAT = "%N|%P|%c|%m|%G"
GPUS = re.compile(r"gpu(?::[^:,()]+)?:(\d+)")


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    memory_mb: int
    gpus: int


def parse(sinfo: str) -> dict[str | None, list[Node]]:
    """Nodes by partition from `sinfo -h -N -o SINFO_FORMAT`; the default partition is also
    under None."""
    partitions: dict[str | None, list[Node]] = {}
    for line in sinfo.splitlines():
        if not line.strip():
            continue
        name, partition, cpus, memory, gres = line.strip().split("|")
        node = Node(
            name,
            int(cpus),
            int(memory.rstrip("+")),
            sum(int(n) for n in GPUS.findall(gres)),
        )
        keys: list[str | None] = [partition.rstrip("*")]
        if partition.endswith("*"):
            keys.append(None)
        for key in keys:
            partitions.setdefault(key, []).append(node)
    return partitions


def read_nodes() -> dict[str | None, list[Node]] | None:
    """What sinfo says, or None when it cannot say (then Slurm itself decides)."""
    shown = scheduler.node_table(SINFO_FORMAT)
    return parse(shown) if shown is not None else None


def check_fits(cfg: PipelineConfig, steps: list[Step], nodes: dict | None = None) -> None:
    """Each step's job asks, per node, for no more CPUs, memory and GPUs than one node of its
    partition has, and for no more nodes than the partition has that fit."""
    nodes = read_nodes() if nodes is None else nodes
    if nodes is None:
        return
    for step in steps:
        params = slurm_parameters(cfg, step)
        partition = params.get("partition")
        members = nodes.get(partition)
        where = f"partition {partition}" if partition else "the default partition"
        if not members:
            listed = ", ".join(sorted(k for k in nodes if k))
            if partition is None:
                raise ConfigError(
                    f"cluster.partition: Slurm has no default partition; name one of {listed}"
                )
            key = "cluster.partition"
            if partition == cfg.cluster.cpu_partition and partition != cfg.cluster.partition:
                key = "cluster.cpu_partition"
            raise ConfigError(f"{key}: Slurm has no partition {partition} (sinfo lists {listed})")
        spares = step.placement is Placement.TRAINING_RANKS and cfg.resilience.spare_nodes
        nodes_key = "resilience.spare_nodes" if spares else "cluster.nodes"
        _check_step(step.name, params, members, where, nodes_key)


def _check_step(
    name: str, params: dict, members: list[Node], where: str, nodes_key: str = "cluster.nodes"
) -> None:
    per_node = params.get("ntasks_per_node", 1)
    cpus = per_node * params.get("cpus_per_task", 1)
    memory_mb = int(params["mem"].rstrip("G")) * 1024 if "mem" in params else 0
    gpus = params.get("gpus_per_node", 0)
    asks = [
        (
            "cluster.cpus_per_task",
            cpus,
            lambda n: n.cpus,
            f"{per_node} tasks x {params.get('cpus_per_task', 1)} CPUs = {cpus} CPUs",
            "CPUs",
        ),
        ("cluster.mem_gb", memory_mb, lambda n: n.memory_mb, f"{memory_mb} MB of memory", "MB"),
        ("cluster.gpus_per_node", gpus, lambda n: n.gpus, f"{gpus} GPUs", "GPUs"),
    ]
    for key, wanted, has, what, unit in asks:
        largest = max(members, key=has)
        if wanted > has(largest):
            raise ConfigError(
                f"{key}: the {name} job asks {what} per node; the largest node of {where} "
                f"({largest.name}) has {has(largest)} {unit}, so Slurm would keep it pending "
                "forever"
            )
    fitting = [n for n in members if n.cpus >= cpus and n.memory_mb >= memory_mb and n.gpus >= gpus]
    if params.get("nodes", 1) > len(fitting):
        raise ConfigError(
            f"{nodes_key}: the {name} job asks {params['nodes']} nodes; {where} has "
            f"{len(fitting)} that fit it ({len(members)} in all), so Slurm would keep it "
            "pending forever"
        )
