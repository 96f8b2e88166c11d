"""GPT pretraining on Slurm clusters with megatron-core: tokenize, train, evaluate, export.

The package, from the ground up (each imports only what stands above it here; README's "How
the code is laid out" has the exact table):

    core/                        errors, atomic files, run paths, lock, step placement (no torch)
    config/ runtime/ reporting/  the typed config; process groups and devices; the run's report
    data/ model/                 JSONL to indexed shards and datasets; the megatron-core model
    training/                    the loop, checkpoints, metrics
    evaluation/ planning/        a checkpoint's evaluation; memory, speed, checks before submission
    orchestration/               the step graph, executors (in-process, subprocess, Slurm, dry run)
    __main__ step status plan cli usage   the command lines
"""

import warnings

from pipeline.runtime import children

__version__ = "0.6.0"

# megatron-core warns at import, in every process, that optional accelerators are absent;
# the backends say what they use instead.
warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).*not installed.*")
warnings.filterwarnings("ignore", message=r"full scope is deprecated")
# megatron-core 0.16's checkpoint loading calls torch APIs that torch marks deprecated: nothing
# a user of this pipeline can act on, printed at every resume and evaluation.
warnings.filterwarnings(
    "ignore", category=FutureWarning, message=r"`load_state_dict` is deprecated"
)
warnings.filterwarnings(
    "ignore", category=FutureWarning, message=r"Please use DTensor instead and we are deprecating"
)

children.die_with_this_process()  # forked helpers (checkpoint writers) never outlive a run
