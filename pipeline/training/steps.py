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
from pipeline.config import PipelineConfig, keys
from pipeline.config.derived import validation_samples
from pipeline.config.keys import Role
from pipeline.core import files, provenance
from pipeline.core.errors import OutOfMemory, StageError
from pipeline.core.paths import RunPaths
from pipeline.core.provenance import MadeFrom
from pipeline.core.steps import Change, Interrupted, MarkedStep, Placement
from pipeline.data import sources
from pipeline.data.steps import VERIFY
from pipeline.model.huggingface.files import identity
from pipeline.resilience import faults, progress
from pipeline.training import checkpoint_records, signals

if TYPE_CHECKING:
    from pipeline.training.trainer import TrainRecord

# Changed, the CONTINUE keys let a finished or interrupted training go on (train.steps only
# upwards): they decide what comes next, not what was trained. The NOT_SETTING ones (parallel
# layout, micro-batches, kernels, logging, how checkpoints are written) resume as usual.
CONTINUABLE = keys.with_role(PipelineConfig, Role.CONTINUE)


class TrainStep(MarkedStep):
    name = "train"
    placement = Placement.TRAINING_RANKS

    def made_from(self, cfg: PipelineConfig) -> MadeFrom:
        settings = {
            **keys.settings(cfg.model, "model"),
            **keys.settings(cfg.train, "train", apart=("eval_samples",)),  # as samples, below
            "train.validation_samples": validation_samples(cfg),
            "data.sources weights": sources.weights(cfg.data),  # what training samples from
        }
        if cfg.model.init_from:  # the weights it starts from, not only their folder's name
            settings["model.init_from weights"] = identity(Path(cfg.model.init_from))
        return provenance.made_from(settings, verify=VERIFY.fingerprint(cfg))

    def recorded(self, cfg: PipelineConfig) -> MadeFrom | None:
        """What the finished training, or else its newest checkpoint, was made from."""
        done = self.marked(cfg)
        if done is not None:
            return done
        state = checkpoint_records.tracked_state(RunPaths.of(cfg.workdir))
        return None if state is None else state.get("made_from", {})

    def change(self, recorded: MadeFrom, now: MadeFrom) -> Change:
        found = provenance.differences(recorded, now, provenance.defaults(PipelineConfig))
        steps = [(old, new) for key, old, new in found if key == "train.steps"]
        more_steps = all(isinstance(old, int) and new >= old for old, new in steps)
        continuable = all(key in CONTINUABLE for key, _, _ in found)
        return Change.CONTINUE if continuable and more_steps else Change.REFUSE

    def marker(self, cfg: PipelineConfig) -> Path:
        return RunPaths.of(cfg.workdir).train_done

    def outputs(self, cfg: PipelineConfig) -> list[Path]:
        paths = RunPaths.of(cfg.workdir)
        return [paths.checkpoints, paths.train_dir]

    def make(self, cfg: PipelineConfig, made_from: MadeFrom) -> TrainRecord | Interrupted:
        paths = RunPaths.of(cfg.workdir)
        signals.listen()  # a stop signal from now on is acted on at the first step boundary
        from pipeline.training.trainer import Trainer  # torch: imported by the job that trains

        try:
            trainer = Trainer(cfg, made_from)
            if trainer.rank.is_first:
                files.write_text(paths.train_config, config.to_yaml(cfg))
            return trainer.fit()
        except Exception as e:
            if isinstance(e, StageError) or not faults.out_of_memory(e):
                raise
            raise OutOfMemory(out_of_memory_line(cfg, e)) from e


def out_of_memory_line(cfg: PipelineConfig, error: Exception) -> str:
    """What ran out of memory, and the keys that need less of it."""
    step = progress.reported_step()
    where = f" in step {step + 1}" if step is not None else ""
    t = cfg.train
    recompute = getattr(t.recompute, "value", t.recompute)
    return (
        f"out of memory{where} ({str(error).strip().splitlines()[0][:120]}): lower "
        f"train.micro_batch_size (now {t.micro_batch_size}) or recompute activations with "
        f"train.recompute=selective or full (now {recompute}); not retried"
    )


TRAIN = TrainStep()
