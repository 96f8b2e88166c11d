"""A mixture of experts across two nodes of the real local Slurm cluster: expert parallelism 2
over one gloo rank on each node (each node holds four of the eight experts, tokens gathered
across the nodes), on one process's loss curve."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.core.paths import RunPaths
from tests.conftest import SMALL_SERIAL, cli, copy_tokenized
from tests.slurm.test_pipeline_on_slurm import pipeline, wait_for

MOE = ["model=moe-tiny", *SMALL_SERIAL, "train.log_interval=1", "stages=[train]"]
TWO_NODES = [
    "cluster=slurm",
    "cluster.nodes=2",
    "cluster.tasks_per_node=1",
    "cluster.cpus_per_task=1",
    "parallel.expert=2",
]


def _records(workdir: Path) -> dict[int, dict]:
    lines = (workdir / "train" / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines) if "loss" in r}


def test_experts_shared_out_over_two_nodes_follow_one_process(slurm_cluster, tokenized, tmp_path):
    single = copy_tokenized(tokenized, tmp_path / "single")
    result = cli(f"workdir={single}", *MOE)
    assert result.returncode == 0, result.stderr[-3000:]

    workdir = copy_tokenized(tokenized, tmp_path / "run")
    pipeline(f"workdir={workdir}", *MOE, *TWO_NODES)
    states = wait_for(workdir, 600)
    assert all(r["state"] == "COMPLETED" for rs in states.values() for r in rs), states
    [attempt] = json.loads(RunPaths.of(workdir).ranks.read_text())["attempts"]
    assert len({r["node"] for r in attempt["ranks"]}) == 2  # one rank on each node

    ours, reference = _records(workdir), _records(single)
    assert sorted(ours) == sorted(reference) == list(range(1, 21))
    for step, record in reference.items():
        assert abs(ours[step]["loss"] - record["loss"]) <= 1e-3, step
        assert ours[step]["moe_layers"].keys() == record["moe_layers"].keys()
