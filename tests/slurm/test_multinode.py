"""Training across nodes of a real Slurm cluster (several slurmd daemons on this machine, node
names that are not host names): one job of 2 nodes x 2 gloo ranks, launched as on a GPU
cluster (srun, one task per rank, the rendezvous at the first node's NodeAddr), whose ranks
ran on different nodes and whose loss follows a single process's on the same data (data 4,
tensor 2 x data 2, pipeline 2 x data 2); the same run continued on one node of two data-parallel ranks; a node
lost while the job trains; requests no node can run."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path

import pytest

from pipeline.core.paths import RunPaths
from tests.conftest import SMALL_SERIAL, cli, copy_tokenized
from tests.slurm.conftest import SCRIPT
from tests.slurm.test_pipeline_on_slurm import DONE, pipeline, wait_for

ENDED = DONE - {"NODE_FAIL"}
BATCH = ["train.micro_batch_size=2", "train.global_batch_size=8", "stages=[train]"]
TWO_NODES = [
    "cluster=slurm",
    "cluster.nodes=2",
    "cluster.tasks_per_node=2",
    "cluster.cpus_per_task=1",
]
LAYOUTS = {
    "data4": [],
    "tensor2_data2": ["parallel.tensor=2"],
    "pipeline2_data2": ["parallel.pipeline=2"],
}
ONE_NODE = ["cluster.nodes=1", "parallel.tensor=1", "parallel.pipeline=1"]


def losses(workdir: Path) -> dict[int, float]:
    lines = (workdir / "train" / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}


@pytest.fixture(scope="module")
def single(tokenized, tmp_path_factory) -> dict[int, float]:
    """The losses of the same model and data in one process (cluster=local), accumulating 4
    micro-batches: 20 steps, then continued to 30 as the runs below are."""
    workdir = copy_tokenized(tokenized, tmp_path_factory.mktemp("single"))
    for more in ([], ["train.steps=30"]):
        result = cli(f"workdir={workdir}", *SMALL_SERIAL, *BATCH, *more)
        assert result.returncode == 0, result.stderr[-3000:]
    return losses(workdir)


def assert_same_curve(ours: dict[int, float], reference: dict[int, float]) -> None:
    assert ours.keys() == reference.keys() and len(ours) >= 4
    for step, loss in reference.items():
        assert abs(ours[step] - loss) <= 1e-4 * abs(loss), (step, ours[step], loss)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_two_nodes_of_two_ranks_train_as_one_process_does_then_continue_on_one_node(
    slurm_cluster, tokenized, single, tmp_path, layout
):
    workdir = copy_tokenized(tokenized, tmp_path / "run")
    pipeline(f"workdir={workdir}", *SMALL_SERIAL, *BATCH, *TWO_NODES, *LAYOUTS[layout])
    states = wait_for(workdir, 600)
    assert all(r["state"] == "COMPLETED" for rs in states.values() for r in rs), states

    [attempt] = json.loads(RunPaths.of(workdir).ranks.read_text())["attempts"]
    ranks = attempt["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    nodes = [r["node"] for r in ranks]
    assert nodes[0] == nodes[1] != nodes[2] == nodes[3], nodes  # two ranks on each of two nodes
    assert [r["local_rank"] for r in ranks] == [0, 1, 0, 1]
    if layout == "tensor2_data2":  # a tensor-parallel pair inside a node, as on GPU clusters
        assert [(r["tensor"], r["data"]) for r in ranks] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    if layout == "pipeline2_data2":  # megatron-core's order: stages across nodes, data inside
        assert [(r["pipeline"], r["data"]) for r in ranks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    [train_job] = json.loads((workdir / "jobs.json").read_text())[-1]["jobs"]["train"]
    accounted = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", train_job, "-o", "NodeList"],
        capture_output=True, text=True, timeout=60,
    ).stdout.split()  # fmt: skip
    assert accounted and set(nodes) <= expand(accounted[0])

    assert_same_curve(losses(workdir), {s: v for s, v in single.items() if s <= 20})

    # the same run continued on one node of two ranks (data-parallel 2, no tensor parallelism):
    # the same global batch, model, optimizer state, schedule and data position
    pipeline(f"workdir={workdir}", "train.steps=30", *ONE_NODE)
    states = wait_for(workdir, 600)
    assert all(r["state"] == "COMPLETED" for rs in states.values() for r in rs), states
    attempts = json.loads(RunPaths.of(workdir).ranks.read_text())["attempts"]
    assert [(a["from_step"], len({r["node"] for r in a["ranks"]})) for a in attempts] == [
        (0, 2),
        (20, 1),
    ]
    assert_same_curve(losses(workdir), single)


def expand(nodelist: str) -> set[str]:
    shown = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=60
    )
    return set(shown.stdout.split())


def test_a_node_lost_mid_training_is_requeued_and_finishes_from_its_last_checkpoint(
    slurm_cluster, tokenized, tmp_path
):
    """One node of the 2-node training job is lost while it trains (its slurmd and everything
    it ran killed, the node DOWN): it leaves the job (--no-kill), the job's supervisor tells a
    lost node from a crash and, with no spare, requeues the job without it onto the nodes
    left; it resumes from its newest complete checkpoint, the checkpoints completed
    before stay as they were, and the loss curve is the one of a run that never lost a
    node."""
    workdir = copy_tokenized(tokenized, tmp_path / "run")
    steps = ["train.steps=120", "train.save_interval=20", "train.keep_last=10"]
    pipeline(f"workdir={workdir}", *SMALL_SERIAL, *BATCH, *TWO_NODES, *steps)
    checkpoints = RunPaths.of(workdir).checkpoints
    first = wait_until(lambda: (checkpoints / "iter_0000040" / "COMPLETE.json").exists(), 600)
    assert first, "the job never saved step 40"
    [attempt] = json.loads(RunPaths.of(workdir).ranks.read_text())["attempts"]
    lost = attempt["ranks"][-1]["node"]
    kept = {p.name: digest(p) for p in checkpoints.glob("iter_*") if (p / "COMPLETE.json").exists()}
    local_slurm("lose-node", slurm_cluster.dir, lost)  # its slurmd and job processes killed
    try:
        states = wait_for(workdir, 900, ended=ENDED)  # a requeue follows the loss
    finally:
        local_slurm("restore-node", slurm_cluster.dir, lost)
    assert states["train"][0]["state"] == "COMPLETED", states
    [train_job] = json.loads((workdir / "jobs.json").read_text())[-1]["jobs"]["train"]
    restarts = subprocess.run(
        ["sacct", "-j", train_job, "-D", "-X", "-n", "-P", "-o", "State"],
        capture_output=True, text=True, timeout=60,
    ).stdout.split()  # fmt: skip
    assert len(restarts) == 2, restarts  # the allocation that lost its node, then the rest
    [fault] = [json.loads(line) for line in RunPaths.of(workdir).failures_log.open()]
    assert (fault["kind"], fault["nodes"]) == ("node lost", [lost])
    assert fault["action"] == f"requeued without {lost} (no spare node left)"
    attempts = json.loads(RunPaths.of(workdir).ranks.read_text())["attempts"]
    assert len(attempts) == 2 and attempts[1]["from_step"] >= 40
    assert lost not in {r["node"] for r in attempts[1]["ranks"]}  # requeued onto the others
    for name, before in kept.items():  # nothing completed was redone or damaged
        assert digest(checkpoints / name) == before, name
    uninterrupted = tmp_path / "uninterrupted"
    copy_tokenized(tokenized, uninterrupted)
    result = cli(f"workdir={uninterrupted}", *SMALL_SERIAL, *BATCH, *steps)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_curve(losses(workdir), losses(uninterrupted))


def wait_until(condition, timeout_s: float) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.5)
    return False


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def local_slurm(command: str, cluster: Path, node: str) -> None:
    done = subprocess.run(
        [str(SCRIPT), command, str(cluster), node], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "ask,refusal",
    [
        (
            ["cluster.cpus_per_task=3"],
            "error: cluster.cpus_per_task: the train job asks 2 tasks x 3 CPUs = 6 CPUs per "
            "node; the largest node of the default partition (n1) has 4 CPUs, so Slurm would "
            "keep it pending forever\n",
        ),
        (
            ["cluster.nodes=4", "train.global_batch_size=16"],
            "error: cluster.nodes: the train job asks 4 nodes; the default partition has 3 that "
            "fit it (3 in all), so Slurm would keep it pending forever\n",
        ),
    ],
)
def test_a_job_no_node_can_run_is_refused_before_anything_is_submitted(
    slurm_cluster, tmp_path, ask, refusal
):
    """Read from the cluster's own sinfo: its nodes declare 4 CPUs each, and it has 3."""
    workdir = tmp_path / "run"
    batch = ["train.micro_batch_size=2", "train.global_batch_size=8"]
    refused = pipeline(f"workdir={workdir}", *SMALL_SERIAL, *batch, *TWO_NODES, *ask, check=False)
    assert refused.returncode == 2 and refused.stderr == refusal, refused.stderr
    assert not workdir.exists()
    queue = subprocess.run(["squeue", "-h"], capture_output=True, text=True, timeout=60)
    assert queue.stdout == ""
