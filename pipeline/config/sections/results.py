"""What a run makes of its trained model: the evaluation (eval.*) and the Hugging Face export
(export.*)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config import choices as c
from pipeline.config import rules as r
from pipeline.config.keys import NOT_SETTING, OUTPUT, key
from pipeline.config.rules import AT_LEAST_ONE, NOT_NEGATIVE, POSITIVE


@dataclass
class EvalConfig:
    checkpoint: str = key("best", OUTPUT, "best | latest | a checkpoint folder", common=True)
    max_batches: int | None = key(
        None, OUTPUT, "micro-batches per evaluated set; none: all", rule=AT_LEAST_ONE
    )
    micro_batch_size: int | None = key(
        None, OUTPUT, "none: train.micro_batch_size", rule=AT_LEAST_ONE
    )
    prompts: list[str] = key(
        role=OUTPUT,
        help="prompts of the samples generated",
        factory=lambda: ["The function returns", "Python is", "To open a file,"],
    )
    max_new_tokens: int = key(48, OUTPUT, "tokens generated per prompt", rule=NOT_NEGATIVE)
    top_k: int = key(40, OUTPUT, "sampling's", rule=NOT_NEGATIVE)
    top_p: float = key(0.9, OUTPUT, "sampling's", rule=r.PROBABILITY)
    extra_sets: dict[str, str] = key(
        role=OUTPUT,
        help="more held-out sets: NAME=JSONL glob",
        factory=dict,
        rule=r.EXTRA_SET_NAMES,
    )
    all_checkpoints: bool = key(False, OUTPUT, "the test loss of every kept checkpoint too")
    # lm-evaluation-harness tasks, each scored in a job of its own (pipeline.evaluation.harness)
    harness_tasks: list[str] = key(role=OUTPUT, help="lm-evaluation-harness tasks", factory=list)
    # while training runs: every N-th kept checkpoint scored by its own job, which training
    # does not wait for; the final checkpoint is scored after training in any case
    harness_every: int = key(
        0,
        OUTPUT,
        "score every N-th kept checkpoint on the tasks; 0: after training only",
        rule=NOT_NEGATIVE,
    )
    # folders of task YAMLs with their data on local disk: compute nodes often have no network
    task_paths: list[str] = key(
        role=OUTPUT,
        help="folders of task YAMLs the harness reads besides its own",
        factory=list,
        rule=r.FOLDERS,
    )
    # tasks' data fetched once on submission (from a login node with network), read offline
    cache_dir: str | None = key(
        None, NOT_SETTING, "the tasks' data cache; none: WORKDIR/eval/cache"
    )
    # none: the lowest validation loss; TASK/METRIC (hellaswag/acc_norm): the best score
    select_by: str | None = key(
        None,
        OUTPUT,
        "the best checkpoint by a task's metric (TASK/METRIC); none: validation loss",
        rule=r.TASK_METRIC,
    )


@dataclass
class ExportConfig:
    """The export stage and `python -m pipeline.export`: the checkpoint eval.checkpoint names, as
    a Hugging Face model folder with its tokenizer."""

    out: str | None = key(
        None, NOT_SETTING, "the folder; none: WORKDIR/export", rule=r.FOLDER_TO_WRITE, common=True
    )
    dtype: c.ExportDtype = key(c.ExportDtype.bf16, OUTPUT, "the weights' dtype", common=True)
    shard_gb: float = key(
        5.0, OUTPUT, "the most weight bytes in one safetensors file", rule=POSITIVE
    )
