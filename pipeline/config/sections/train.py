"""How the model is trained (train.*): batch, schedule, optimizer, precision, kernels,
validation and checkpoints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.config import choices as c
from pipeline.config import rules as r
from pipeline.config.choices import AUTO
from pipeline.config.keys import CONTINUE, NOT_SETTING, OUTPUT, command, key
from pipeline.config.rules import AT_LEAST_ONE, FRACTION, NOT_NEGATIVE, POSITIVE


@dataclass
class TrainConfig:
    # auto (GPU runs): the planner picks the fastest micro-batch whose memory estimate fits
    # the GPU with a margin (pipeline.planning.auto), before anything runs; settled, it is read
    # as an int from pipeline.config.derived.settled
    micro_batch_size: Any = key(
        8, NOT_SETTING, "sequences per rank and pass, or auto", rule=r.whole_or(AUTO), common=True
    )
    global_batch_size: int = key(
        32, OUTPUT, "sequences per training step", rule=AT_LEAST_ONE, common=True
    )
    grad_accum: int | None = key(
        None, NOT_SETTING, "derived from the batch sizes", rule=AT_LEAST_ONE
    )
    # Sweeps: keep global_batch_size and derive micro_batch_size from a given grad_accum
    hold_global_batch: bool = key(False, NOT_SETTING, "derive the micro-batch from grad_accum")
    steps: int = key(
        1000, CONTINUE, "training steps; more continues a run", rule=AT_LEAST_ONE, common=True
    )
    lr: float = key(3e-4, OUTPUT, "the peak learning rate", rule=POSITIVE, common=True)
    min_lr: float = key(
        3e-5, OUTPUT, "the learning rate at the end of the decay", rule=NOT_NEGATIVE
    )
    warmup_steps: int = key(100, OUTPUT, "steps of linear warm-up", rule=NOT_NEGATIVE)
    lr_decay_style: c.LrDecayStyle = key(c.LrDecayStyle.cosine, OUTPUT, "the decay's shape")
    weight_decay: float = key(0.1, OUTPUT, "AdamW's", rule=NOT_NEGATIVE)
    adam_beta1: float = key(0.9, OUTPUT, "AdamW's", rule=FRACTION)
    adam_beta2: float = key(0.95, OUTPUT, "AdamW's", rule=FRACTION)
    adam_eps: float = key(1e-8, OUTPUT, "AdamW's", rule=POSITIVE)
    clip_grad: float = key(1.0, OUTPUT, "the gradient norm's limit", rule=NOT_NEGATIVE)
    precision: c.Precision = key(c.Precision.bf16, OUTPUT, "the math's precision", common=True)
    fp8_recipe: c.Fp8Recipe = key(c.Fp8Recipe.delayed, OUTPUT, "fp8 scaling")
    recompute: c.Recompute = key(
        c.Recompute.none, NOT_SETTING, "activations recomputed in the backward pass", common=True
    )
    recompute_layers: int | None = key(None, NOT_SETTING, "full recompute: layers per stage")
    device: c.Device = command(c.Device.auto, "where training runs")
    # the same initial model under any tensor-parallel layout (slower to start large models)
    init_on_cpu: bool = key(False, OUTPUT, "initialise whole weights on the CPU, then shard")
    # GPU kernels (docs/benchmarks.md has the figures), ignored on CPU:
    wgrad_fusion: bool = key(
        True, NOT_SETTING, "weight gradients accumulated in TE's GEMMs (no apex needed)"
    )
    te_activation: bool = key(True, NOT_SETTING, "TE's SwiGLU/GeLU, not megatron-core's fused")
    # split, rotation and, backwards, the QKV gradient in one pass; false: TE's RoPE
    compiled_rope: bool = key(True, NOT_SETTING, "RoPE over the unsplit QKV, one compiled kernel")
    # never the PyPI package named apex; false leaves it out (TE's GEMMs still accumulate theirs)
    apex: bool = key(True, NOT_SETTING, "NVIDIA apex's gradient-accumulation fusion, installed")
    seed: int = key(1234, OUTPUT, "the seed of initialisation and sampling")
    log_interval: int = key(10, NOT_SETTING, "steps between log lines", rule=AT_LEAST_ONE)
    profile_steps: list[int] = key(
        role=NOT_SETTING, help="[first, last]: profiled into train/profile.txt", factory=list
    )
    eval_interval: int = key(
        100, CONTINUE, "steps between validations", rule=AT_LEAST_ONE, common=True
    )
    # the same sequences each time, whatever the micro-batch or ranks, so runs compare;
    # recorded as train.validation_samples
    eval_samples: int = key(64, OUTPUT, "sequences each validation reads", rule=AT_LEAST_ONE)
    # Read from run folders and jobs of earlier versions; refused on a command line
    eval_iters: int | None = key(None, NOT_SETTING, "before eval_samples: micro-batches per rank")
    save_interval: int = key(
        200, CONTINUE, "steps between checkpoints; 0: none", rule=NOT_NEGATIVE, common=True
    )
    keep_last: int = key(2, CONTINUE, "checkpoints kept besides the best one", rule=AT_LEAST_ONE)
    # training waits only for the copy to host memory, which holds one more copy of the shard
    async_save: bool = key(True, NOT_SETTING, "write checkpoints in the background", common=True)
    # the state is gathered and reshaped on the host at each save (a minute at 1.3B); false
    # saves each rank's shard in place, and a resume keeps the tensor/pipeline layout
    reshardable_optimizer: bool = key(
        False, NOT_SETTING, "save the distributed optimizer's state for any layout"
    )
    threads: int | None = key(
        None, NOT_SETTING, "CPU threads per rank; none: torch's", rule=AT_LEAST_ONE
    )
    nonfinite: c.NonFinite = key(c.NonFinite.skip, CONTINUE, "a NaN/inf step: skip or stop")
    # fp16's loss-scale overflows do not count
    max_skipped_in_a_row: int = key(
        10,
        CONTINUE,
        "with nonfinite=skip: this many NaN/inf steps in a row stop a diverged run",
        rule=AT_LEAST_ONE,
    )
    # Derived, not a setting
    auto_choice: str | None = key(None, NOT_SETTING, "what the planner chose for auto, and why")
