"""`python -m pipeline.step STEP [overrides]`: run one step of the graph in this process, for
sbatch scripts written by hand (see slurm/). Under srun every task calls it: the distributed
environment comes from Slurm's variables, an array task's index from SLURM_ARRAY_TASK_ID.

    STEP: tokenizer | tokenize | verify | index | train | evaluate
"""

from __future__ import annotations

import logging
import os
import sys

import hydra
from omegaconf import DictConfig

from pipeline import config as config_schema
from pipeline.config import ConfigError

config_schema.register()
STEP = sys.argv.pop(1) if len(sys.argv) > 1 and "=" not in sys.argv[1] else ""


@hydra.main(config_path="../conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    from pipeline import graph, jobs

    logging.getLogger("megatron").setLevel(logging.WARNING)
    try:
        config_schema.validate(cfg)
    except ConfigError as e:
        sys.exit(f"error: {e}")
    steps = {s.name: s for s in graph.build(cfg)}
    if STEP not in steps:
        sys.exit(f"error: step {STEP!r} is not one of {', '.join(steps)} for stages={cfg.stages}")
    step = steps[STEP]
    if "SLURM_JOB_ID" in os.environ:  # submitit's job environment reads Slurm's variables
        os.environ.setdefault("SUBMITIT_EXECUTOR", "slurm")
    if step.is_complete(cfg):
        print(f"[pipeline] {STEP}: already complete", file=sys.stderr)
        return
    if step.array:
        jobs.ArrayTask(step.run, cfg)(int(os.environ.get("SLURM_ARRAY_TASK_ID", "0")))
    elif "SUBMITIT_EXECUTOR" in os.environ:
        jobs.DistributedTask(step.run, cfg)()
    else:  # a plain shell: one process
        step.run(cfg)


if __name__ == "__main__":
    main()
