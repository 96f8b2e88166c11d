"""Does train.micro_batch_size=auto and train.recompute=auto pick a fast layout on this GPU?
For each model, the real training stage with the auto values, beside the other micro-batches
the planner considered, measured in one invocation.

    python tools/bench_layouts.py --workdir /tmp/layouts --data DATA \
        --models gpt-350m gpt-1.3b gpt-2.7b --global-batch 64 --others 2

For each model the planner's options (pipeline.planning.auto) are ranked by its estimate; the
stage runs once with auto (the planner's choice, read back from the run's config.yaml), then
for the `--others` fastest other options whose estimate fits the GPU (without the margin auto
keeps: measuring them says whether the margin costs speed), one micro-batch each, recompute
none unless --recompute names others. It prints, per run, the estimate (memory, tokens/s) and
the measurement (median tokens/s after warm-up, MFU, peak memory), and the chosen layout's
throughput against the fastest measured. DATA is a run folder tokenized with
tools/bench_train.py's settings (32k BPE).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.bench_train import AUTO, VOCAB, StageRun, run_stage, stage_overrides  # noqa: E402


def planner_view(model: str, global_batch: int) -> tuple[list, int, str]:
    """The planner's options for the model on this machine's GPU, fastest first by its
    estimate, the GPU's capacity in bytes, and what auto chooses (its explanation)."""
    from pipeline.config import compose
    from pipeline.planning import auto, hardware, run_gpu

    overrides = [o for o in stage_overrides(model, 1, global_batch, 10) if "micro_batch" not in o]
    cfg = compose("/tmp/unused", *overrides, *AUTO, check=False)
    capacity, _, _ = auto.gpu_capacity(cfg)
    settled = auto.settle(cfg)
    hw = hardware.of(cfg, run_gpu.of(cfg).name)  # the GPU found here, as the launcher's estimate
    return auto.options(cfg, VOCAB, hw), capacity, settled.train.auto_choice


def measured(workdir: Path, model: str, micro: int | None, recompute: str, args) -> dict:
    """The stage at this micro-batch and recompute (None, "auto": the planner's); another
    option on one GPU, without the margin the planner's auto keeps (so not its search)."""
    one_gpu = ["parallel.tensor=1", "parallel.pipeline=1"]
    extra = [] if micro is None else [f"train.recompute={recompute}", *one_gpu]
    run = StageRun(model, micro, args.global_batch, extra)
    return run_stage(workdir, run, args.steps, args.warmup, args.data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="a tokenized run folder")
    parser.add_argument("--models", nargs="+", default=["gpt-350m", "gpt-1.3b", "gpt-2.7b"])
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--others", type=int, default=2, help="other options measured")
    parser.add_argument("--recompute", nargs="+", default=["none"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()

    for model in args.models:
        options, capacity, choice = planner_view(model, args.global_batch)
        print(f"# {model}: {choice}", flush=True)
        estimate = {(o.layout.micro_batch, o.layout.recompute): o for o in options}
        rows = [("auto", measured(args.workdir / f"{model}-auto", model, None, "auto", args))]
        chosen = (rows[0][1].get("micro_batch_size"), rows[0][1].get("recompute"))
        others = [
            o
            for o in options
            if o.memory <= capacity
            and o.layout.recompute in args.recompute
            and (o.layout.micro_batch, o.layout.recompute) != chosen
        ]
        seen = set()
        for option in others:
            lo = option.layout
            if len(seen) == args.others or lo.micro_batch in seen:
                continue
            seen.add(lo.micro_batch)
            name = f"mb{lo.micro_batch}-{lo.recompute}"
            folder = args.workdir / f"{model}-{name}"
            result = measured(folder, model, lo.micro_batch, lo.recompute, args)
            rows.append((name, result))
        for name, result in rows:
            print(json.dumps({"model": model, "run": name, **result}), flush=True)
        fastest = max((r["tokens_per_s"] for _, r in rows if "tokens_per_s" in r), default=None)
        print(f"\n| {model} | micro-batch x accumulation, recompute | planned GiB | "
              "planned tokens/s | tokens/s | MFU | peak GiB | of the fastest |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")
        for name, r in rows:
            key = (r.get("micro_batch_size") or 0, r.get("recompute"))
            o = estimate.get(key)
            layout = f"{key[0]} x {args.global_batch // max(1, key[0])}, {key[1]}"
            label = f"{'auto: ' if name == 'auto' else ''}{layout}"
            if "error" in r:
                last = r["error"].strip().splitlines()[-1] if r["error"].strip() else "?"
                print(f"| {model} | {label} | {o.memory / 2**30 if o else 0:.1f} | - | "
                      f"failed: {last[:160]} |")  # fmt: skip
                continue
            print(
                f"| {model} | {label} | {o.memory / 2**30 if o else 0:.1f} | "
                f"{o.tokens_per_s if o else 0:,.0f} | {r['tokens_per_s']:,.0f} | "
                f"{100 * r['mfu']:.1f}% | {r['peak_mem_gib']:.1f} | "
                f"{100 * r['tokens_per_s'] / fastest:.1f}% |"
            )
        print(flush=True)


if __name__ == "__main__":
    main()
