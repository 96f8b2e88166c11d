"""NaN and inf injected for real into the real model while it trains: the step's update is
skipped and counted, or training stops, as train.nonfinite says; no checkpoint with non-finite
weights is ever written."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from pipeline.core.errors import NonFinite
from pipeline.core.paths import RunPaths
from pipeline.training import checkpoint
from pipeline.training.steps import TRAIN
from pipeline.training.trainer import Trainer
from tests.conftest import changed, trainer_of


def poison_loss(trainer: Trainer, step: int) -> None:
    """Multiply the model's output (the per-token loss) by NaN during training step `step`."""

    def hook(module, inputs, output):
        if module.training and trainer.state.step == step - 1:
            return output * math.nan
        return None

    trainer.chunks[0].register_forward_hook(hook)


def poison_gradient(trainer: Trainer, step: int) -> None:
    """Make the output layer's gradient infinite during training step `step`; the loss stays
    finite."""
    weight = trainer.chunks[0].output_layer.weight

    def hook(grad):
        return torch.full_like(grad, math.inf) if trainer.state.step == step - 1 else None

    weight.register_hook(hook)


def weights_entering_each_step(trainer: Trainer) -> dict[int, list[torch.Tensor]]:
    """A copy of the weights as each training step begins, by step number."""
    seen: dict[int, list[torch.Tensor]] = {}

    def hook(module, inputs):
        step = trainer.state.step + 1
        if module.training and step not in seen:
            seen[step] = [p.detach().clone() for p in module.parameters()]

    trainer.chunks[0].register_forward_pre_hook(hook)
    return seen


def saved_weights_are_finite(root) -> bool:
    folders = sorted(root.glob("iter_*"))
    assert folders, "no checkpoint was saved"
    for folder in folders:  # read with torch alone, not with the pipeline's loader
        whole = folder / "whole.pt"
        dcp_to_torch_save(folder / "dist", whole)
        state = torch.load(whole, weights_only=False)
        whole.unlink()
        if not all(torch.isfinite(v).all() for v in state.values() if torch.is_tensor(v)):
            return False
    return True


def test_a_nan_loss_skips_that_update_and_training_goes_on(run_copy, capfd):
    trainer = trainer_of(run_copy)
    poison_loss(trainer, step=7)
    weights = weights_entering_each_step(trainer)
    result = trainer.fit()
    log = capfd.readouterr().err
    assert "step 7: loss nan, grad norm nan: not finite, update skipped (1 skipped so far" in log
    assert result["status"] == "complete" and result["train_steps"] == 20
    assert result["skipped_steps"] == 1
    assert math.isfinite(result["last_train_loss"])
    assert all(torch.equal(a, b) for a, b in zip(weights[7], weights[8], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(weights[8], weights[9], strict=True))
    assert saved_weights_are_finite(RunPaths.of(run_copy.workdir).checkpoints)


def test_an_infinite_gradient_with_a_finite_loss_skips_that_update(run_copy, capfd):
    trainer = trainer_of(run_copy)
    poison_gradient(trainer, step=5)
    weights = weights_entering_each_step(trainer)
    result = trainer.fit()
    log = capfd.readouterr().err
    line = next(x for x in log.splitlines() if x.startswith("step 5: loss"))
    assert "grad norm inf: not finite, update skipped (1 skipped so far" in line
    assert math.isfinite(float(line.split()[3].rstrip(",")))  # the loss itself was finite
    assert result["skipped_steps"] == 1 and result["train_steps"] == 20
    assert all(torch.equal(a, b) for a, b in zip(weights[5], weights[6], strict=True))
    assert saved_weights_are_finite(RunPaths.of(run_copy.workdir).checkpoints)


def test_stop_policy_stops_at_the_step_and_saves_nothing_after_it(run_copy):
    trainer = trainer_of(changed(run_copy, "train", nonfinite="stop"))
    poison_loss(trainer, step=13)
    with pytest.raises(NonFinite, match=r"^step 13: loss nan, grad norm nan is not finite; stop"):
        trainer.fit()
    paths = RunPaths.of(run_copy.workdir)
    assert [p.name for p in paths.checkpoints.glob("iter_*")] == [checkpoint.folder_name(10)]
    assert saved_weights_are_finite(paths.checkpoints)
    assert not paths.train_done.exists()


def test_a_learning_rate_that_overflows_stops_with_the_step_and_value(run_copy):
    # finite, but the second update sends weights near 1e38
    cfg = changed(run_copy, "train", nonfinite="stop", lr=1e38)
    stopped = r"^step \d+: loss \S+, grad norm (nan|inf) is not finite; stopped"
    with pytest.raises(NonFinite, match=stopped):
        TRAIN.run(cfg)
    root = RunPaths.of(run_copy.workdir).checkpoints
    assert not list(root.glob("iter_*")), "stopped before the first save"


def test_weights_that_are_not_finite_are_never_saved(run_copy):
    """A weight the loss never sees (the embedding row of the unknown token, which byte
    fallback never produces) goes infinite: training carries on, the save refuses."""
    trainer = trainer_of(run_copy)
    embedding = trainer.chunks[0].embedding.word_embeddings.weight

    def hook(module, inputs):
        if trainer.state.step == 15:
            with torch.no_grad():
                embedding[0, 0] = math.inf

    trainer.chunks[0].register_forward_pre_hook(hook)
    with pytest.raises(NonFinite, match=r"^step 20: the weights are not finite \(embedding\."):
        trainer.fit()
    paths = RunPaths.of(run_copy.workdir)
    assert [p.name for p in paths.checkpoints.glob("iter_*")] == [checkpoint.folder_name(10)]
    assert saved_weights_are_finite(paths.checkpoints)
    assert (paths.checkpoints / checkpoint.TRACKER).read_text().strip() == "iter_0000010"
    assert not paths.train_done.exists()


def test_updates_skipped_many_times_in_a_row_stop_a_diverged_run(run_copy):
    """From step 12 on every loss is NaN: the run stops at the fourth skip in a row
    (train.max_skipped_in_a_row=4), saying so, instead of 'finishing' on frozen weights."""
    trainer = trainer_of(changed(run_copy, "train", max_skipped_in_a_row=4))
    poison_loss(trainer, step=7)  # one skip, then updates again: the count starts over

    def always(module, inputs, output):
        return output * math.nan if module.training and trainer.state.step >= 11 else None

    trainer.chunks[0].register_forward_hook(always)
    stopped = (
        r"^step 15: the last 4 updates were all skipped as not finite "
        r"\(train.max_skipped_in_a_row=4\): training has diverged; stopped"
    )
    with pytest.raises(NonFinite, match=stopped):
        trainer.fit()
    paths = RunPaths.of(run_copy.workdir)
    assert [p.name for p in paths.checkpoints.glob("iter_*")] == [checkpoint.folder_name(10)]
    assert not paths.train_done.exists()


def test_a_perplexity_beyond_floating_point_is_reported_as_infinite(run_copy):
    """Weights drawn 2,500 times too wide give logits in the thousands and a finite test loss
    of hundreds of nats, whose exp overflows: the evaluation reports perplexity inf (a
    diverged model's figure) instead of failing."""
    from pipeline.evaluation.steps import EVALUATE

    cfg = changed(run_copy, "model", init_method_std=50.0)
    cfg = changed(cfg, "train", lr=1e-9, min_lr=0.0)
    TRAIN.run(cfg)
    result = EVALUATE.run(changed(cfg, "eval", max_batches=2))
    assert math.isfinite(result["test_loss"]) and result["test_loss"] > 710  # exp(710) overflows
    assert result["test_ppl"] == math.inf
    report = (RunPaths.of(cfg.workdir).report).read_text()
    assert "| test_ppl | inf |" in report
