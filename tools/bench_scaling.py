"""Data, tensor and pipeline parallel training on the GPUs of one host, measured beside the
planner's prediction, in one call: for the day a machine with 2, 4 or 8 GPUs is lent.

    python tools/bench_scaling.py --workdir /tmp/scaling --models gpt-1.3b llama-8b

For each model it runs the real training stage (the pipeline's own launcher: one process per
GPU) under each layout of `layouts()` that the planner's memory estimate fits on the GPUs:
plain data parallelism (overlapped gradient reduction and parameter gathering), tensor
parallelism over all GPUs (sequence parallel), pipeline parallelism over all GPUs (interleaved
where the layers allow), and TP=2 x PP=N/2 from 4 GPUs on. It prints, per layout, the median
tokens/s per GPU after warm-up beside the throughput model's estimate for the same config on
this host's GPU (pipeline.planning.throughput), the error, and the planner's breakdown. Data:
the built-in corpus tokenized once with a 32k BPE (tools/bench_train.py), or --data. Then it
runs the multi-GPU tests of tests/gpu (their 2-GPU data and tensor parallel runs against one
GPU's curve) unless --no-tests, and exits with their status.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.bench_train import VOCAB, prepare_data, stage_overrides  # noqa: E402

SEQ = 2048


@dataclass(frozen=True)
class Layout:
    name: str
    tensor: int
    pipeline: int
    virtual: int | None = None

    def overrides(self) -> list[str]:
        out = [f"parallel.tensor={self.tensor}", f"parallel.pipeline={self.pipeline}"]
        if self.tensor > 1:
            out.append("parallel.sequence_parallel=true")
        if self.virtual:
            out.append(f"parallel.virtual_pipeline={self.virtual}")
        return out


def layouts(num_layers: int, gpus: int) -> list[Layout]:
    """Data, tensor and pipeline parallel layouts of a model with `num_layers` on `gpus` GPUs
    (TP at most 8; PP only where it divides the layers; interleaved with two virtual stages
    where each stage's layers split in two)."""
    found = [Layout("data", 1, 1)]
    if gpus == 1:
        return found
    if gpus <= 8:
        found.append(Layout("tensor", gpus, 1))
    if num_layers % gpus == 0:
        virtual = 2 if (num_layers // gpus) % 2 == 0 else None
        found.append(Layout("pipeline", 1, gpus, virtual))
    if gpus >= 4 and num_layers % (gpus // 2) == 0:
        found.append(Layout("tensor+pipeline", 2, gpus // 2))
    return found


def run_overrides(model: str, layout: Layout, gpus: int, micro: int, batch: int, steps: int):
    """The training stage's overrides: bench_train's, on `gpus` local GPUs, one process each."""
    base = stage_overrides(model, micro, batch, steps)
    base = [o for o in base if not o.startswith(("cluster.gpus_per_node=", "stages="))]
    return [
        *base,
        f"cluster.gpus_per_node={gpus}",
        "cluster.executor=subprocess",
        "stages=[train]",
        *layout.overrides(),
    ]


def planned(overrides: list[str], gpu: str) -> dict:
    """The planner's memory and speed estimate of the config on this host's GPUs: the plan the
    launcher would make (pipeline.planning.run_plan)."""
    from pipeline.config import compose
    from pipeline.planning import auto, hardware, run_plan
    from pipeline.runtime.gpus import model_name

    # the model of nvidia-smi's name (H100 for "NVIDIA H100 80GB"); H100's for one unknown
    name = hardware.preset(model_name(gpu) or hardware.DEFAULT_GPU).name
    cfg = compose("/tmp/unused", *overrides, f"cluster.gpu={name}", settle=auto.settle)
    plan = run_plan.make(cfg, (VOCAB, "tools/bench_train.py"))
    return {"memory_gib": plan.memory["total"] / 2**30, "fits": bool(plan.fits), **plan.step}


def fitting(model: str, layout: Layout, gpus: int, args, batch: int, gpu: str):
    """The overrides and estimate of the largest micro-batch (halving from --micro-batch), then
    the least recompute, that the memory estimate fits; the last tried when none does."""
    micro = args.micro_batch
    while True:
        for recompute in ("none", "selective", "full"):
            base = run_overrides(model, layout, gpus, micro, batch, args.warmup + args.steps)
            overrides = [*base, f"train.recompute={recompute}"]
            plan = planned(overrides, gpu)
            if plan["fits"] or (micro == 1 and recompute == "full"):
                return overrides, plan
        micro = max(1, micro // 2)


def measure(workdir: Path, data: Path, overrides: list[str], warmup: int) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    for name in ("corpus", "tokenizer", "data"):
        if not (workdir / name).exists():
            (workdir / name).symlink_to((data / name).resolve())
    cmd = [sys.executable, "-m", "pipeline", f"workdir={workdir}", *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    (workdir / "stage.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        return {"error": proc.stderr[-1500:]}
    records = [json.loads(x) for x in (workdir / "train/metrics.jsonl").read_text().splitlines()]
    timed = sorted(r["tokens_per_s"] for r in records if "tokens_per_s" in r and r["step"] > warmup)
    return {"tokens_per_s": timed[len(timed) // 2] if timed else 0.0}


def local_gpus() -> tuple[int, str]:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True)
    names = [line for line in out.stdout.splitlines() if line.startswith("GPU ")]
    return len(names), names[0].split(":", 1)[1].split("(")[0].strip() if names else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--data", type=Path, help="a tokenized run folder (default: made)")
    parser.add_argument("--models", nargs="+", default=["gpt-1.3b", "llama-8b"])
    parser.add_argument("--gpus", type=int, help="GPUs to use (default: all of this host's)")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--sequences-per-gpu", type=int, default=32, help="global batch / GPUs")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--no-tests", action="store_true", help="skip the multi-GPU tests of tests/gpu after"
    )
    args = parser.parse_args()

    count, name = local_gpus()
    gpus = args.gpus or count
    data = args.data or prepare_data(args.workdir / "data-32k", args.models[0])
    batch = gpus * args.sequences_per_gpu
    print(f"{gpus} x {name}; sequence {SEQ}, global batch {batch}, micro-batch {args.micro_batch}")
    print(
        f"{'model':<10} {'layout':<16} {'measured':>10} {'predicted':>10} {'error':>7}  breakdown"
    )
    from pipeline.config import compose
    from pipeline.planning.render import breakdown_text

    for model in args.models:
        layers = compose("/tmp/unused", f"model={model}", check=False).model.num_layers
        for layout in layouts(layers, gpus):
            overrides, plan = fitting(model, layout, gpus, args, batch, name)
            if not plan["fits"]:
                print(f"{model:<10} {layout.name:<16} needs ~{plan['memory_gib']:.0f} GiB: skipped")
                continue
            run = measure(args.workdir / f"{model}-{layout.name}", data, overrides, args.warmup)
            predicted = plan["tokens_per_s_per_gpu"]
            if "error" in run:
                print(f"{model:<10} {layout.name:<16} failed: {run['error'][-300:]}")
                continue
            measured = run["tokens_per_s"] / gpus
            print(
                f"{model:<10} {layout.name:<16} {measured:>10,.0f} {predicted:>10,.0f} "
                f"{predicted / measured - 1:>+7.1%}  {breakdown_text(plan)}"
            )
    if not args.no_tests:  # the same lease checks that several GPUs train as one does
        tests = [
            "-m",
            "pytest",
            "-m",
            "gpu",
            "tests/gpu",
            "-k",
            "two_gpus",
            "-p",
            "no:cacheprovider",
        ]
        sys.exit(subprocess.run([sys.executable, *tests], cwd=ROOT).returncode)


if __name__ == "__main__":
    main()
