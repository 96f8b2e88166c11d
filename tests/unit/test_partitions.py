"""A job no node of its partition can run is refused before submission, naming the key and
the partition's largest node; jobs that fit pass. The node tables are sinfo's own output
format (`sinfo -h -N -o '%N|%P|%c|%m|%G'`), as a 3-node CPU cluster and a GPU site print it."""

from __future__ import annotations

import pytest

from pipeline.core.errors import ConfigError
from pipeline.orchestration import graph, partitions
from tests.conftest import GPU_GIVEN, make_config

CPU_CLUSTER = "n1|debug*|4|8000|(null)\nn2|debug*|4|8000|(null)\nn3|debug*|4|8000|(null)\n"
GPU_BATCH = "train.global_batch_size=384"  # a multiple of 8 x 24 and 8 x 16 ranks
GPU_SITE = (
    "cpu01|cpu|64|256000|(null)\n"
    "gpu01|gpu*|96|1000000|gpu:h100:8(S:0-1)\n"
    "gpu02|gpu*|96|1000000|gpu:h100:8(S:0-1)\n"
    "gpu03|gpu*|96|500000|gpu:h100:4\n"
)


def check(table: str, *overrides: str) -> None:
    cfg = make_config("/tmp/unused", "cluster=slurm", *overrides)
    partitions.check_fits(cfg, graph.steps(cfg), partitions.parse(table))


def test_the_tables_read_as_sinfo_prints_them():
    nodes = partitions.parse(GPU_SITE)
    assert [n.gpus for n in nodes["gpu"]] == [8, 8, 4] and nodes[None] == nodes["gpu"]
    assert nodes["cpu"] == [partitions.Node("cpu01", 64, 256000, 0)]


def test_jobs_that_fit_pass():
    check(CPU_CLUSTER, "cluster.nodes=2", "cluster.tasks_per_node=2", "cluster.cpus_per_task=2")
    check(CPU_CLUSTER, "cluster.nodes=3", "cluster.cpus_per_task=4", "train.global_batch_size=48")
    check(GPU_SITE, *GPU_GIVEN, "cluster.gpus_per_node=8", "cluster.nodes=2", GPU_BATCH)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ("cluster.nodes=2", "cluster.tasks_per_node=2", "cluster.cpus_per_task=3"),
            "cluster.cpus_per_task: the train job asks 2 tasks x 3 CPUs = 6 CPUs per node; the "
            "largest node of the default partition (n1) has 4 CPUs, so Slurm would keep it "
            "pending forever",
        ),
        (
            ("cluster.nodes=4",),
            "cluster.nodes: the train job asks 4 nodes; the default partition has 3 that fit it "
            "(3 in all), so Slurm would keep it pending forever",
        ),
        (
            ("cluster.mem_gb=16",),
            "cluster.mem_gb: the tokenizer job asks 16384 MB of memory per node; the largest "
            "node of the default partition (n1) has 8000 MB, so Slurm would keep it pending "
            "forever",
        ),
        (
            ("cluster.partition=gpu",),
            "cluster.partition: Slurm has no partition gpu (sinfo lists debug)",
        ),
    ],
)
def test_a_job_no_node_can_run_is_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as refused:
        check(CPU_CLUSTER, *overrides)
    assert str(refused.value) == message


def test_gpus_and_nodes_that_fit_are_counted_together():
    with pytest.raises(ConfigError, match=r"^cluster.gpus_per_node: .* asks 16 GPUs per node; "):
        check(GPU_SITE, *GPU_GIVEN, "cluster.gpus_per_node=16")
    with pytest.raises(ConfigError, match=r"^cluster.nodes: the train job asks 3 nodes; "):
        check(GPU_SITE, *GPU_GIVEN, "cluster.gpus_per_node=8", "cluster.nodes=3", GPU_BATCH)


def test_spare_nodes_that_the_partition_lacks_are_refused_naming_them():
    with pytest.raises(ConfigError, match=r"^resilience.spare_nodes: the train job asks 4 nodes; "):
        check(CPU_CLUSTER, "cluster.nodes=2", "resilience.spare_nodes=2")
    check(CPU_CLUSTER, "cluster.nodes=2", "resilience.spare_nodes=1")  # 3 of 3: it fits
