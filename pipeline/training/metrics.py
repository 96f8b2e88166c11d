"""What training logs: train/metrics.jsonl, TensorBoard and the experiment trackers (the
logging rank alone), the throughput with Megatron-LM's FLOP formula, and the console line of a
logged step."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pipeline.config import PipelineConfig
from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.tracking.trackers import Trackers


class MetricsLog:
    """One JSON record a line (training steps, validations, resumes), mirrored to
    TensorBoard and the enabled trackers. Every rank holds one; only the logging rank's writes
    anything. Records come at train.log_interval, validations and saves, never every step; the
    trackers queue them (W&B's service process, MLflow's asynchronous batches)."""

    def __init__(self, paths: RunPaths, enabled: bool, cfg: PipelineConfig | None = None) -> None:
        self.paths, self.enabled = paths, enabled
        self.writer = None
        # TensorBoard's last step of each key: a key two records of one step carry (the tokens
        # of a step's validation and of its training line) is written once
        self.board_step: dict[str, int] = {}
        self.trackers = Trackers.open(cfg, paths) if enabled and cfg else Trackers([], paths)

    def keep_until(self, step: int) -> None:
        """Keep the records of the steps up to `step`, the one this attempt starts from: a
        killed run may have logged later steps, which are done again, or died mid-line."""
        path = self.paths.metrics
        if not self.enabled or not path.exists():
            return
        kept, dropped = [], []
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # cut short by a kill
            if record["step"] <= step:
                kept.append(line + "\n")
            else:
                dropped.append(record)
        files.write_text(path, "".join(kept))
        self.trackers.already_hold(dropped)

    def open_tensorboard(self, resumed_at: int) -> None:
        if not self.enabled:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            return
        # On resume, TensorBoard drops what a killed run logged after the checkpoint.
        purge = resumed_at + 1 if resumed_at else None
        self.writer = SummaryWriter(str(self.paths.tensorboard), purge_step=purge)

    def record(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.paths.metrics, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.writer is not None:
            step = record["step"]
            for key, value in record.items():
                if key == "step" or not isinstance(value, (int, float)):
                    continue
                if self.board_step.get(key, -1) < step:
                    self.writer.add_scalar(key, value, step)
                    self.board_step[key] = step
        self.trackers.log(record)

    def close(self, finished: bool = False) -> None:
        """Flush and close; `finished`: the report is written, send it to the trackers (jobs
        of one rank; with more, the logging rank is not the one that wrote it, and the
        evaluation sends it)."""
        if self.writer is not None:
            self.writer.close()
        self.trackers.finish(artifacts=finished)


@dataclass(frozen=True)
class Throughput:
    """tokens/s, TFLOP/s per GPU and MFU of a window of steps."""

    tokens_per_step: int
    flops_per_step: float  # Megatron-LM's formula, the whole job
    ranks: int
    peak_tflops: float | None  # per GPU; None: MFU unknown (CPU, an unknown GPU)
    on_cuda: bool

    def over(self, steps: int, seconds: float) -> dict[str, float]:
        tflops = steps * self.flops_per_step / seconds / self.ranks / 1e12
        out = {"tokens_per_s": steps * self.tokens_per_step / seconds, "tflops_per_gpu": tflops}
        if self.peak_tflops:
            out["mfu"] = tflops / self.peak_tflops
        if self.on_cuda:
            import torch

            out["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
        return out


def console_line(r: dict, total_steps: int) -> str:
    parts = [
        f"step {r['step']}/{total_steps}",
        f"loss {r['loss']:.4f}",
        f"grad {r['grad_norm']:.3f}",
        f"lr {r['lr']:.2e}",
        f"{r['tokens_per_s']:,.0f} tok/s",
        f"{r['tflops_per_gpu']:.2f} TFLOP/s/GPU",
    ]
    if "moe/max_over_mean" in r:  # router health of a mixture of experts
        parts.append(
            f"experts max/mean {r['moe/max_over_mean']:.2f}, {r['moe/idle_experts']} idle, "
            f"{100 * r['moe/dropped']:.1f}% dropped"
        )
    if "moe/aux_loss" in r:
        parts.append(f"aux {r['moe/aux_loss']:.3f}")
    if "mfu" in r:
        parts.append(f"MFU {100 * r['mfu']:.1f}%")
    if "peak_mem_gib" in r:
        parts.append(f"mem {r['peak_mem_gib']:.1f} GiB")
    return " | ".join(parts)
