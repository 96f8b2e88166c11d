"""dry_run=true: print the job graph and, for Slurm, each sbatch script the real submission
would write; run, submit and write nothing."""

from __future__ import annotations

from pipeline.config import PipelineConfig
from pipeline.core.steps import Placement
from pipeline.orchestration.executors import slurm
from pipeline.orchestration.executors.base import resources
from pipeline.orchestration.graph import Step


def describe_graph(steps: list[Step], cfg: PipelineConfig) -> str:
    """The chain of jobs as one line, e.g. tokenizer -> tokenize[4 tasks] -> ... -> evaluate."""

    def one(step: Step) -> str:
        needs = resources(step, cfg)
        what = [f"{step.tasks(cfg)} tasks"] if step.placement is Placement.ARRAY else []
        if needs.ranks > 1 or needs.gpus_per_node:
            what.append(f"{needs.nodes} node(s) x {needs.tasks_per_node} task(s)")
        if needs.gpus_per_node:
            what.append(f"{needs.gpus_per_node} GPU(s)/node")
        return step.name + (f"[{', '.join(what)}]" if what else "")

    return " -(afterok)-> ".join(one(s) for s in steps) or "(nothing to do)"


class DryRunExecutor:
    name = "dry_run"

    def __init__(self, real_executor: str) -> None:
        self.real_executor = real_executor  # the one the real run would use

    def run(self, steps: list[Step], cfg: PipelineConfig) -> None:
        print(f"Job graph: {describe_graph(steps, cfg)}")
        if self.real_executor != slurm.SlurmExecutor.name:
            return
        for before, step in zip([None, *steps], steps, strict=False):
            after = f"<{before.name} job>" if before else None
            print(f"\n# ---- {step.name} ----\n{slurm.script(cfg, step, after)}")
