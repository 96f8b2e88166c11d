"""The learning-rate and weight-decay schedule of a training run."""

from __future__ import annotations

from pipeline.config import TrainConfig


def lr_scheduler(optimizer, t: TrainConfig):
    """megatron-core's schedule: linear warm-up to train.lr, then train.lr_decay_style down to
    train.min_lr at train.steps (WSD: the last tenth of the steps). On resume the config's
    values are kept over the checkpoint's: a run continued to more train.steps follows the
    longer schedule from the step it resumes at (every other value is the same, or the run
    was refused; pipeline.training.steps)."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    return OptimizerParamScheduler(
        optimizer,
        init_lr=0.0,
        max_lr=t.lr,
        min_lr=t.min_lr,
        lr_warmup_steps=t.warmup_steps,
        lr_decay_steps=t.steps,
        lr_decay_style=t.lr_decay_style,
        start_wd=t.weight_decay,
        end_wd=t.weight_decay,
        wd_incr_steps=t.steps,
        wd_incr_style="constant",
        wsd_decay_steps=max(1, t.steps // 10),
        lr_wsd_decay_style="linear",
        use_checkpoint_opt_param_scheduler=False,
        override_opt_param_scheduler=True,
    )
