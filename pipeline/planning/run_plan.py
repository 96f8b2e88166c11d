"""The plan of a run, made once from the resolved config (at launch, and by `python -m
pipeline.plan`): its layout, memory breakdown and step-time breakdown, the GPU and fabric they
were estimated for, why the auto values are what they are, whether it trains on GPUs, its
parameter count and FLOPs. It is handed to the preflight checks, the printed plan and --json,
and written to the run folder's plan.json, which the report reads; nothing after it
recomputes these figures.

plan.json is a record of the launch, not an input of any step: the completion markers and
the rerun verdicts (pipeline.orchestration.reruns) never read it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import PipelineConfig
from pipeline.config.derived import trains_on_gpu
from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.data import summary
from pipeline.data.summary import DataSummary
from pipeline.model.backends import names as backend_names
from pipeline.model.figures import ModelFigures
from pipeline.planning import hardware, run_gpu, search
from pipeline.planning.hardware import Hardware
from pipeline.planning.parallel_layout import ParallelLayout
from pipeline.planning.run_gpu import RunGpu

FORMAT = 1  # plan.json's format, raised when a field changes meaning


@dataclass(frozen=True)
class Plan:
    model: str
    data: DataSummary  # the vocabulary and the sources' training tokens
    layout: ParallelLayout
    memory: Mapping[str, int]  # bytes on the busiest GPU (or CPU rank), by part
    step: Mapping[str, float]  # one step's expected seconds by part, tokens/s, MFU on `hardware`
    gpu: RunGpu | None  # the run's GPU; None: a CPU run that names none
    hardware: Hardware  # the GPU and fabric of `step` (H100's, assumed, where gpu is None)
    reasons: str | None  # what the auto values became, and why (train.auto_choice)
    on_gpu: bool  # whether the training job is meant for GPUs (derived.trains_on_gpu)
    backend: str  # the model backend it trains with (model.backends.names.for_training)
    # the model's parameters, padded vocabulary and FLOPs for the layout, as the estimates read
    figures: ModelFigures

    @property
    def fits(self) -> bool | None:
        """Whether the memory estimate fits the GPU; None where its memory is not known."""
        if self.gpu is None or self.gpu.capacity is None:
            return None
        return self.memory["total"] <= self.gpu.capacity

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "model": self.model,
            "vocab_size": self.data.vocab_size,
            "vocab_source": self.data.vocab_source,
            "layout": dataclasses.asdict(self.layout),
            "description": self.layout.describe(),
            "memory_bytes": dict(self.memory),
            "step": dict(self.step),
            "gpu": dataclasses.asdict(self.gpu) if self.gpu else None,
            "hardware": dataclasses.asdict(self.hardware),
            "fits": self.fits,
            "reasons": self.reasons,
        }


def make(cfg: PipelineConfig, vocab: tuple[int, str] | None = None) -> Plan:
    """The plan of a validated config whose auto values are settled; `vocab`: the vocabulary
    size and where it came from, when the caller has it (else read as the run would)."""
    data = summary.summarize(cfg, vocab)
    on_gpu = trains_on_gpu(cfg)
    layout = ParallelLayout.of(cfg)
    gpu = run_gpu.of(cfg)
    hw = hardware.of(cfg, (gpu or run_gpu.ASSUMED).name)
    estimate = search.estimate(cfg.model, data.vocab_size, layout, hw)  # the auto search's, if made
    return Plan(
        model=cfg.model.name,
        data=data,
        layout=layout,
        memory=estimate.memory,
        step=estimate.throughput,
        gpu=gpu,
        hardware=hw,
        reasons=cfg.train.auto_choice,
        on_gpu=on_gpu,
        backend=backend_names.for_training(on_gpu),
        figures=estimate.figures,
    )


def path(workdir: str | Path) -> Path:
    return RunPaths.of(workdir).plan


def write(plan: Plan, workdir: str | Path) -> Path:
    """plan.json in the run folder, written atomically."""
    target = path(workdir)
    files.write_json(target, plan.to_json())
    return target
