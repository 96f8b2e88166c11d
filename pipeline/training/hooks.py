"""What each feature does at every training step, as a hook the loop (Trainer.fit) runs: the
loop trains, and progress reports, the profiler, straggler timing, completing checkpoints and
stop signals come in as hooks. A new feature adds a hook, not lines in the loop."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import torch

from pipeline.config import PipelineConfig
from pipeline.resilience import progress
from pipeline.training.profiling import StepProfiler
from pipeline.training.signals import StopRequest
from pipeline.training.stragglers import StragglerWatch


class StepHook:
    """One feature's part in a training step; each method does nothing unless overridden.
    `step` counts from 1: the step starting (`before`) or just done (`after`)."""

    def before(self, step: int) -> None:
        pass

    def during(self) -> AbstractContextManager:
        """Around the step's forward, backward and optimizer."""
        return contextlib.nullcontext()

    def after(self, step: int, took: float) -> None:
        pass

    def interval(self, step: int, seconds: float) -> dict:
        """Fields for metrics.jsonl at a log interval of `seconds` of training."""
        return {}

    def wants_stop(self) -> bool:
        """Whether to save and stop after this step. Collective: every rank calls it."""
        return False


class StepHooks:
    """The hooks of a run, called in their order."""

    def __init__(self, hooks: list[StepHook]) -> None:
        self.hooks = hooks

    def before(self, step: int) -> None:
        for hook in self.hooks:
            hook.before(step)

    @contextlib.contextmanager
    def during(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for hook in self.hooks:
                stack.enter_context(hook.during())
            yield

    def after(self, step: int, took: float) -> None:
        for hook in self.hooks:
            hook.after(step, took)

    def interval(self, step: int, seconds: float) -> dict:
        fields: dict = {}
        for hook in self.hooks:
            fields.update(hook.interval(step, seconds))
        return fields

    def wants_stop(self) -> bool:
        return any([hook.wants_stop() for hook in self.hooks])  # each: a collective on each rank


class ProgressHook(StepHook):
    """The rank's phase and step time, for the hang watchdog (pipeline.resilience)."""

    def before(self, step: int) -> None:
        progress.phase("data", step - 1)

    def after(self, step: int, took: float) -> None:
        progress.step_took(took)


class ProfilerHook(StepHook):
    def __init__(self, profiler: StepProfiler) -> None:
        self.profiler = profiler

    def before(self, step: int) -> None:
        self.profiler.step_starts(step)

    def after(self, step: int, took: float) -> None:
        self.profiler.step_ends(step)


class StragglerHook(StepHook):
    def __init__(self, watch: StragglerWatch) -> None:
        self.watch = watch

    def during(self) -> AbstractContextManager:
        return self.watch.step()

    def interval(self, step: int, seconds: float) -> dict:
        return self.watch.interval(step, seconds)


class CheckpointHook(StepHook):
    """A checkpoint written in the background meanwhile is completed at the step's end."""

    def __init__(self, complete: Callable[[], None]) -> None:
        self.complete = complete

    def after(self, step: int, took: float) -> None:
        self.complete()


class SignalHook(StepHook):
    """A time-limit warning, SIGTERM or Ctrl-C on any rank: every rank saves and stops."""

    def __init__(self, stop: StopRequest, device: torch.device) -> None:
        self.stop, self.device = stop, device

    def wants_stop(self) -> bool:
        return self.stop.agreed(self.device)


def step_hooks(
    cfg: PipelineConfig,
    device: torch.device,
    profile: Path,
    logs: bool,
    stop: StopRequest,
    complete_checkpoint: Callable[[], None],
) -> StepHooks:
    """What runs at each step of a training besides the step itself, in this order."""
    return StepHooks(
        [
            ProfilerHook(StepProfiler(list(cfg.train.profile_steps), profile, logs)),
            ProgressHook(),
            StragglerHook(StragglerWatch(cfg.resilience.straggler_threshold, device)),
            CheckpointHook(complete_checkpoint),
            SignalHook(stop, device),
        ]
    )
