"""`python -m pipeline.resilience.rank TASK`: one training rank of an attempt that the job's
supervisor (pipeline.resilience.supervisor) started with srun; TASK is the pickled
DistributedTask it wrote into the job's log folder."""

from __future__ import annotations

import os
import sys

from pipeline.core.errors import StageError


def main(argv: list[str]) -> None:
    import cloudpickle

    # the attempt runs on some of the job's nodes: to its ranks, those are the job's
    for job, step in (("NODELIST", "STEP_NODELIST"), ("NUM_NODES", "STEP_NUM_NODES")):
        if f"SLURM_{step}" in os.environ:
            os.environ[f"SLURM_JOB_{job}"] = os.environ[f"SLURM_{step}"]
    os.environ["SUBMITIT_EXECUTOR"] = "slurm"  # submitit's job environment reads Slurm's
    with open(argv[0], "rb") as f:
        task = cloudpickle.load(f)
    try:
        task()
    except StageError:  # already said in one line by the task
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
