"""GPT pretraining on Slurm clusters with megatron-core: tokenize, train, evaluate.

The package, from the ground up (imports flow one way, upwards):

    core/           errors, atomic files, run paths, lock, what a step is (no torch)
    config/         the schema, its checks, derived values, composition
    runtime/        torch.distributed from the environment, devices, GPU models
    data/  model/   from JSONL to indexed shards and datasets; the megatron-core model
    reporting/      summary.json, plots, report.md/html
    training/  evaluation/   the loop and checkpoints; the evaluation of a checkpoint
    planning/       memory, speed and layout search before submission
    orchestration/  the step graph, executors (in-process, subprocess, Slurm, dry run)
    __main__ step status plan cli   the command lines
"""

import warnings

from pipeline import legacy

__version__ = "0.2.0"

# megatron-core warns at import, in every process, that optional accelerators are absent;
# the backends say what they use instead.
warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).*not installed.*")
warnings.filterwarnings("ignore", message=r"full scope is deprecated")

legacy.install()  # jobs queued by 0.1 still load (see pipeline.legacy)
