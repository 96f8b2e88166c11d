"""Executors behind one interface, chosen by name; the sbatch scripts the Slurm executor writes
for a few configs equal the expected files kept beside this test (expected_sbatch/, paths
replaced by <workdir> and <python>; first made by the version before the package layout, then
changed only on purpose: a site's NCCL variables, srun options and containers). After an
intended change of the scripts, rewrite them with PIPELINE_UPDATE_EXPECTED=1 and read the diff."""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from pathlib import Path

import pytest

from pipeline.core.steps import Placement
from pipeline.orchestration import executors, graph
from pipeline.orchestration.executors.base import resources
from tests.conftest import GPU_GIVEN, ROOT, make_config

EXPECTED = Path(__file__).parent / "expected_sbatch"
WORKDIR = "/nonexistent/run"
CONFIGS = {
    "slurm": ["cluster=slurm"],
    "gpu-site": [
        "cluster=gpu-cluster",
        *GPU_GIVEN,
        "model=gpt-1.3b",
        "+cluster.sbatch_extra.constraint=h100",
        "cluster.account=proj",
    ],
    "gpu-container": [
        "cluster=gpu-cluster",
        *GPU_GIVEN,
        "model=gpt-1.3b",
        "cluster.container_image=/images/pretrain.sqsh",
        "cluster.container_mounts=[/lustre:/lustre,/scratch:/scratch:ro]",
        "cluster.env.NCCL_SOCKET_IFNAME=eth0",
        "stages=[train]",
    ],
    "cpu-ranks": [
        "cluster=slurm",
        "cluster.tasks_per_node=2",
        "cluster.cpu_partition=cpu",
        "cluster.partition=batch",
        "data.num_shards=3",
        "stages=[tokenize,train]",
    ],
}


def dry_run(*overrides: str) -> str:
    cfg = make_config(WORKDIR, "dry_run=true", *overrides)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        executors.select(cfg).run(graph.pending(cfg), cfg)
    return out.getvalue().replace(WORKDIR, "<workdir>").replace(sys.executable, "<python>")


def as_files(text: str) -> dict[str, str]:
    """graph.txt and N-STEP.sbatch, as the expected folder holds them."""
    graph_line, *scripts = text.split("\n# ---- ")
    found = {"graph.txt": graph_line.strip() + "\n"}
    for i, script in enumerate(scripts):
        step, body = script.split(" ----\n", 1)
        found[f"{i}-{step}.sbatch"] = body.rstrip() + "\n"
    return found


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_dry_run_scripts_equal_the_expected_files(name):
    found = as_files(dry_run(*CONFIGS[name]))
    folder = EXPECTED / name
    if os.environ.get("PIPELINE_UPDATE_EXPECTED"):
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        for file, text in found.items():
            (folder / file).write_text(text)
    expected = {p.name: p.read_text() for p in sorted(folder.iterdir())}
    assert sorted(found) == sorted(expected)
    for file, text in expected.items():
        assert found[file] == text, f"{name}/{file} differs from the expected script"


def test_executors_are_chosen_by_name(tmp_path):
    chosen = {
        overrides: type(executors.select(make_config(tmp_path, *overrides))).__name__
        for overrides in [
            (),
            ("cluster.executor=subprocess",),
            ("cluster=slurm",),
            ("dry_run=true",),
            ("cluster=slurm", "dry_run=true"),
        ]
    }
    assert list(chosen.values()) == [
        "InProcessExecutor",
        "SubprocessExecutor",
        "SlurmExecutor",
        "DryRunExecutor",
        "DryRunExecutor",
    ]
    assert sorted(executors.EXECUTORS) == ["inprocess", "slurm", "subprocess"]


def test_each_step_says_where_it_runs_and_the_cluster_gives_it_resources(tmp_path):
    cfg = make_config(tmp_path, "cluster=gpu-cluster", *GPU_GIVEN, "model=gpt-1.3b")
    placements = {step.name: step.placement for step in graph.steps(cfg)}
    assert placements == {
        "tokenizer": Placement.CPU,
        "tokenize": Placement.ARRAY,
        "verify": Placement.CPU,
        "index": Placement.CPU,
        "train": Placement.TRAINING_RANKS,
        "evaluate": Placement.ONE_DEVICE,
    }
    needs = {step.name: resources(step, cfg) for step in graph.steps(cfg)}
    assert (needs["train"].nodes, needs["train"].tasks_per_node, needs["train"].gpus_per_node) == (
        2,
        8,
        8,
    )
    assert needs["train"].requeue and needs["train"].time_limit == "24:00:00"
    assert (needs["evaluate"].ranks, needs["evaluate"].gpus_per_node) == (1, 1)
    assert all(needs[s].time_limit == "04:00:00" for s in ("tokenizer", "tokenize", "index"))


def test_the_downstream_job_gets_the_training_s_tensor_x_pipeline_ranks(tmp_path):
    """A checkpoint is scored in the layout it was trained in: a GPU per tensor x pipeline rank
    on Slurm (over nodes where one has too few), as many processes on CPU ranks."""
    from pipeline.evaluation.downstream_step import DOWNSTREAM
    from pipeline.orchestration.executors.slurm import slurm_parameters

    assert DOWNSTREAM.placement is Placement.MODEL_RANKS
    gpus = [*GPU_GIVEN, "model=gpt-1.3b", "parallel.pipeline=2"]
    cfg = make_config(tmp_path, "cluster=gpu-cluster", *gpus, "parallel.tensor=2")
    needs = resources(DOWNSTREAM, cfg)
    assert (needs.nodes, needs.tasks_per_node, needs.gpus_per_node) == (1, 4, 4)
    params = slurm_parameters(cfg, DOWNSTREAM)
    assert (params["nodes"], params["ntasks_per_node"], params["gpus_per_node"]) == (1, 4, 4)
    wide = make_config(tmp_path, "cluster=gpu-cluster", *gpus, "parallel.tensor=8")
    assert resources(DOWNSTREAM, wide).ranks == 16 and resources(DOWNSTREAM, wide).nodes == 2
    cpu = make_config(tmp_path, "cluster.tasks_per_node=2", "parallel.tensor=2")
    needs = resources(DOWNSTREAM, cpu)
    assert (needs.ranks, needs.gpus_per_node) == (2, 0)
    one = resources(DOWNSTREAM, make_config(tmp_path))
    assert (one.ranks, one.gpus_per_node) == (1, 0)


def test_the_graph_orders_the_steps_of_the_stages_asked_for(tmp_path):
    def names(*overrides: str) -> list[str]:
        return [s.name for s in graph.steps(make_config(tmp_path, *overrides))]

    assert names() == ["tokenizer", "tokenize", "verify", "index", "train", "evaluate"]
    assert names("stages=[tokenize]") == ["tokenizer", "tokenize", "verify"]
    assert names("stages=[train,evaluate]") == ["index", "train", "evaluate"]


def test_submitit_is_used_by_the_executors_alone_and_its_private_api_by_slurm_alone():
    package = ROOT / "pipeline"
    uses = {str(path.relative_to(package)): path.read_text() for path in package.rglob("*.py")}
    private = sorted(p for p, text in uses.items() if re.search(r"\._make_submission", text))
    assert private == ["orchestration/executors/slurm.py"]
    submitit = sorted(
        p for p, text in uses.items() if re.search(r"^\s*import submitit", text, re.M)
    )
    assert all(p.startswith("orchestration/") for p in submitit), submitit


def test_slurm_s_commands_are_run_by_the_scheduler_adapter_alone():
    package = ROOT / "pipeline"
    command = re.compile(r"""["'](sbatch|scontrol|squeue|sinfo|scancel|sacct)["']\s*,""")
    calling = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if command.search(path.read_text())
    )
    assert calling == ["resilience/scheduler.py"]


RANK_LOG = """\
step 20/40 | loss 5.0
Process ForkProcess-3:
Traceback (most recent call last):
  File "/usr/lib/python3.11/multiprocessing/process.py", line 314, in _bootstrap
    self.run()
OSError: [Errno 27] File too large

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "async_utils.py", line 9, in write
RuntimeError: worker failed
warning: no space left writing checkpoint c: File too large (EFBIG); the save of step 20 is skipped
step 25/40 | loss 4.9
hang: no progress for 10 s (resilience.hang_timeout_s=10): rank 1 on n1 in optimizer of step 26
Thread 0x00007f01 (most recent call first):
  File "trainer.py", line 120 in fit

Current thread 0x00007f02 (most recent call first):
  <no Python frame>
[watchdog] hang at step 26: ended the attempt
[rank1]: Traceback (most recent call last):
[rank1]:   File "<frozen runpy>", line 198, in _run_module_as_main
[rank1]: pipeline.core.errors.NonFinite: step 30: loss inf
"""


def test_a_local_job_s_console_gets_its_lines_and_its_log_the_traces_and_stacks(tmp_path, capsys):
    from pipeline.orchestration.executors.subprocesses import _followed

    log = tmp_path / "rank1.err"
    log.write_text(RANK_LOG)
    with _followed(log, every_s=0.01):
        pass
    assert capsys.readouterr().err.splitlines() == [
        "step 20/40 | loss 5.0",
        "warning: no space left writing checkpoint c: File too large (EFBIG); the save of step "
        "20 is skipped",
        "step 25/40 | loss 4.9",
        "hang: no progress for 10 s (resilience.hang_timeout_s=10): rank 1 on n1 in optimizer of "
        "step 26",
        "[watchdog] hang at step 26: ended the attempt",
    ]
