"""`python -m pipeline.step STEP [overrides]`: run one step in this process, for sbatch scripts
written by hand (see slurm/). Under srun every task calls it: the distributed environment
comes from Slurm's variables, an array task's index from SLURM_ARRAY_TASK_ID.

    STEP: tokenizer | tokenize | verify | index | train | downstream | evaluate | export
"""

from __future__ import annotations

import functools
import os
import sys

import hydra
from omegaconf import DictConfig

from pipeline import cli, usage
from pipeline.config import PipelineConfig
from pipeline.core import log
from pipeline.core.errors import ConfigError
from pipeline.core.steps import Placement
from pipeline.orchestration import graph, reruns
from pipeline.orchestration.tasks import ArrayTask, DistributedTask

_log = log.get("pipeline")


def run_step(name: str, cfg: PipelineConfig) -> None:
    steps = graph.by_name(cfg)
    if name not in steps:
        raise ConfigError(f"step {name!r} is not one of {', '.join(steps)} for stages={cfg.stages}")
    reruns.refuse_changes(cfg, reruns.judge(cfg))  # never reuse an output made otherwise
    for each in steps.values():  # as the launcher does: the built-in corpus and shard plan
        if each.placement is Placement.ARRAY:
            each.prepare(cfg)
    step = steps[name]
    if "SLURM_JOB_ID" in os.environ:  # submitit's job environment reads Slurm's variables
        os.environ.setdefault("SUBMITIT_EXECUTOR", "slurm")
    if step.is_complete(cfg):
        _log.info(f"{name}: already complete")
        return
    if step.placement is Placement.ARRAY:
        ArrayTask(step, cfg)(int(os.environ.get("SLURM_ARRAY_TASK_ID", "0")))
    elif "SUBMITIT_EXECUTOR" in os.environ:
        DistributedTask(step, cfg)()
    else:  # a plain shell: one process
        step.run(cfg)


def main() -> None:
    log.take_quiet(sys.argv)  # -q: warnings and errors only
    usage.answer_help("pipeline.step", sys.argv[1:])
    name = sys.argv.pop(1) if len(sys.argv) > 1 and "=" not in sys.argv[1] else ""
    sys.argv[1:] = cli.check_overrides(sys.argv[1:])

    @hydra.main(config_path=cli.CONF, config_name="config", version_base=None)
    def step(composed: DictConfig) -> None:
        cli.run(composed, functools.partial(run_step, name), replay=cli.given())

    step()


if __name__ == "__main__":
    main()
