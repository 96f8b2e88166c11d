"""The train step: every rank of the training job runs it. Its output (checkpoints, then
train/DONE.json) records what it was made from: the model, the training settings and the data.
A rerun with more train.steps, or other save and validation intervals, continues from the
newest checkpoint; any other change would mix two trainings in one model, and is refused.
An interrupted training resumes from its newest valid checkpoint, or saves at its first step
when stopped by a signal (Interrupted)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import config
from pipeline.config import PipelineConfig
from pipeline.config.derived import validation_samples
from pipeline.core import files, provenance
from pipeline.core.paths import RunPaths
from pipeline.core.provenance import MadeFrom
from pipeline.core.steps import Change, Interrupted, Placement
from pipeline.data import sources
from pipeline.data.steps import VERIFY
from pipeline.model.huggingface.files import identity
from pipeline.training import checkpoint_records, signals

if TYPE_CHECKING:
    from pipeline.training.trainer import TrainRecord

# The model's math does not depend on these (parallel layout, micro-batches, kernels, logging,
# how checkpoints are written):
# changing them resumes as usual.
NOT_SETTINGS = (
    "micro_batch_size",
    "auto_choice",
    "grad_accum",
    "hold_global_batch",
    "recompute",
    "recompute_layers",
    "device",
    "wgrad_fusion",
    "te_activation",
    "compiled_rope",
    "apex",
    "log_interval",
    "profile_steps",
    "threads",
    "exit_signal_lead_s",
    "async_save",
    "reshardable_optimizer",
    "max_requeues",
    "eval_samples",  # as validation samples, below
    "eval_iters",
)
# Changed, these let a finished or interrupted training go on (train.steps only upwards): they
# decide what comes next, not what was trained.
CONTINUABLE = {
    "train.steps",
    "train.eval_interval",
    "train.save_interval",
    "train.keep_last",
    "train.nonfinite",
    "train.max_skipped_in_a_row",
}


class TrainStep:
    name = "train"
    placement = Placement.TRAINING_RANKS

    def made_from(self, cfg: PipelineConfig) -> MadeFrom:
        settings = {
            **provenance.section(cfg.model, "model"),
            **provenance.section(cfg.train, "train", exclude=NOT_SETTINGS),
            "train.validation_samples": validation_samples(cfg),
            "data.sources weights": sources.weights(cfg.data),  # what training samples from
        }
        if cfg.model.init_from:  # the weights it starts from, not only their folder's name
            settings["model.init_from weights"] = identity(Path(cfg.model.init_from))
        return provenance.made_from(settings, verify=provenance.fingerprint(VERIFY.made_from(cfg)))

    def recorded(self, cfg: PipelineConfig) -> MadeFrom | None:
        """What the finished training, or else its newest checkpoint, was made from."""
        paths = RunPaths.of(cfg.workdir)
        done = files.read_json_or_none(paths.train_done)
        state = done if done is not None else checkpoint_records.tracked_state(paths)
        return None if state is None else state.get("made_from", {})

    def change(self, recorded: MadeFrom, now: MadeFrom) -> Change:
        found = provenance.differences(recorded, now)
        steps = [(old, new) for key, old, new in found if key == "train.steps"]
        more_steps = all(isinstance(old, int) and new >= old for old, new in steps)
        continuable = all(key in CONTINUABLE for key, _, _ in found)
        return Change.CONTINUE if continuable and more_steps else Change.REFUSE

    def is_complete(self, cfg: PipelineConfig) -> bool:
        done = files.read_json_or_none(RunPaths.of(cfg.workdir).train_done)
        return done is not None and done.get("made_from") == self.made_from(cfg)

    def outputs(self, cfg: PipelineConfig) -> list[Path]:
        paths = RunPaths.of(cfg.workdir)
        return [paths.checkpoints, paths.train_dir]

    def run(self, cfg: PipelineConfig) -> TrainRecord | Interrupted:
        paths = RunPaths.of(cfg.workdir)
        if self.is_complete(cfg):
            return files.read_json(paths.train_done)
        signals.listen()  # a stop signal from now on is acted on at the first step boundary
        from pipeline.training.trainer import Trainer  # torch: imported by the job that trains

        trainer = Trainer(cfg, self.made_from(cfg))
        if trainer.rank.is_first:
            files.write_text(paths.train_config, config.to_yaml(cfg))
        return trainer.fit()


TRAIN = TrainStep()
