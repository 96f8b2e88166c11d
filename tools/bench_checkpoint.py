"""What checkpoints cost a GPU training run: the real training stage saving its checkpoints,
once blocking (train.async_save=false, or another source tree with --before-root) and once in
the background, then resumed from its last checkpoint; measured in one invocation.

    python tools/bench_checkpoint.py --workdir /tmp/ck --data DATA --model gpt-1.3b \
        --before-root /tmp/before

For each way of saving it prints, per save, how long training was blocked and how long the
save took (train/metrics.jsonl), the median tokens/s of the steps while a save is written
against the steps far from one, the peak host memory in use during the run beyond what was in
use before it (MemTotal - MemAvailable, sampled every 0.1 s) beside the checkpoint's size, and
for the resume: the load time the stage logs and the wall time from the stage's start to its
first step. DATA is a run folder tokenized with tools/bench_train.py's settings.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.bench_train import stage_overrides  # noqa: E402


def host_memory_in_use() -> int:
    fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    kib = lambda key: int(fields[key].split()[0]) * 1024  # noqa: E731
    return kib("MemTotal") - kib("MemAvailable")


class MemorySampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.baseline, self.peak, self.done = host_memory_in_use(), 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.1):
            self.peak = max(self.peak, host_memory_in_use())

    def extra_gib(self) -> float:
        self.done.set()
        self.join()
        return (self.peak - self.baseline) / 2**30


def run_stage(root: Path, workdir: Path, overrides: list[str]) -> dict:
    """The training stage from source tree `root`; each stderr line with its arrival time."""
    cmd = [sys.executable, "-m", "pipeline", f"workdir={workdir}", *overrides]
    sampler = MemorySampler()
    sampler.start()
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=root, stderr=subprocess.PIPE, text=True)
    lines = [(time.perf_counter() - started, line.rstrip()) for line in proc.stderr]
    proc.wait()
    extra = sampler.extra_gib()
    (workdir / f"stage-{len(list(workdir.glob('stage-*.log')))}.log").write_text(
        "\n".join(f"{t:8.2f} {line}" for t, line in lines)
    )
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n" + "\n".join(x for _, x in lines[-30:]))
    return {"lines": lines, "host_extra_gib": extra}


def merged(*overrides: list[str]) -> list[str]:
    """Hydra overrides, the last value of each key kept."""
    out: dict[str, str] = {}
    for item in (x for group in overrides for x in group):
        out[item.split("=", 1)[0]] = item
    return list(out.values())


def step_gaps(lines: list[tuple[float, str]], total: int) -> dict[int, float]:
    """Seconds from each step's console line to the next one's: at a save step, the step
    plus whatever the save held training for (with log_interval=1)."""
    at = {}
    for t, line in lines:
        if line.startswith("step ") and f"/{total} |" in line:
            at[int(line.split()[1].split("/")[0])] = t
    return {s: at[s + 1] - at[s] for s in at if s + 1 in at}


def first(lines: list[tuple[float, str]], prefix: str) -> float | None:
    return next((t for t, line in lines if line.startswith(prefix)), None)


def checkpoint_gib(workdir: Path) -> float:
    folders = sorted((workdir / "checkpoints").glob("iter_*"))
    return sum(p.stat().st_size for p in folders[-1].rglob("*") if p.is_file()) / 2**30


def measure(root: Path, label: str, args: argparse.Namespace, extra: list[str]) -> dict:
    workdir = args.workdir / label
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    for name in ("corpus", "tokenizer", "data"):
        (workdir / name).symlink_to((args.data / name).resolve())
    base = stage_overrides(args.model, args.micro, args.micro, args.steps)
    common = merged(base, ["stages=[train]", f"train.eval_interval={args.steps}"])
    saving = merged(common, [f"train.save_interval={args.save_interval}", "train.keep_last=1"])
    trained = run_stage(root, workdir, merged(saving, extra))
    records = [json.loads(x) for x in (workdir / "train" / "metrics.jsonl").open()]
    saves = [r for r in records if "checkpoint_blocked_s" in r]
    steps = {r["step"]: r["tokens_per_s"] for r in records if "tokens_per_s" in r}
    save_steps = range(args.save_interval, args.steps, args.save_interval)
    near = [s for s in steps if any(0 < s - k <= args.near for k in save_steps)]
    far = [s for s in steps if s > args.warmup and s not in near]
    gaps = step_gaps(trained["lines"], args.steps)
    usual = statistics.median(gaps[s] for s in far if s in gaps)
    size = checkpoint_gib(workdir)
    # resumed from the last checkpoint, two more steps, saving nothing
    more = merged(common, extra, [f"train.steps={args.steps + 2}", "train.save_interval=0"])
    resumed = run_stage(root, workdir, more)
    records = [json.loads(x) for x in (workdir / "train" / "metrics.jsonl").open()]
    load = [r.get("resume_load_s") for r in records if "resumed_from" in r]
    verify = [r.get("resume_verify_s") for r in records if "resumed_from" in r]
    lines = resumed["lines"]
    start = first(lines, "[pipeline] train: running")
    resumed_at = first(lines, "resumed from")
    first_step = first(lines, f"step {args.steps + 1}/")
    shutil.rmtree(workdir / "checkpoints")  # the disk holds one run's checkpoints at a time
    return {
        "label": label,
        "saves": [(r["step"], r["checkpoint_blocked_s"], r["checkpoint_total_s"]) for r in saves],
        # what a save step took beyond a usual step, from the console lines' arrival times:
        # the same measure for a tree that logs no per-save records
        "save_step_extra_s": [(s, gaps[s] - usual) for s in save_steps if s in gaps],
        "near_tokens_per_s": statistics.median(steps[s] for s in near) if near else None,
        "far_tokens_per_s": statistics.median(steps[s] for s in far),
        "host_extra_gib": trained["host_extra_gib"],
        "checkpoint_gib": size,
        "resume_load_s": load[-1] if load else None,
        "resume_verify_s": verify[-1] if verify else None,
        "stage_start_to_resumed_s": resumed_at - start if start and resumed_at else None,
        "stage_start_to_first_step_s": first_step - start if start and first_step else None,
        "stage_wall_s": trained["lines"][-1][0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="a tokenized run folder")
    parser.add_argument("--model", default="gpt-1.3b")
    parser.add_argument("--micro", type=int, default=8, help="micro-batch (no accumulation)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--save-interval", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the medians")
    parser.add_argument("--near", type=int, default=5, help="steps after a save counted near")
    parser.add_argument(
        "--before-root", type=Path, help="another source tree: its stage is the blocking row"
    )
    args = parser.parse_args()
    runs = [(ROOT, "async", ["train.async_save=true"])]
    if args.before_root:
        runs.insert(0, (args.before_root, "before", []))
    else:
        runs.insert(0, (ROOT, "blocking", ["train.async_save=false"]))
    rows = []
    for root, label, extra in runs:
        rows.append(measure(root, label, args, extra))
        print(json.dumps(rows[-1]), flush=True)
    print(f"\n{args.model}, micro-batch {args.micro}, {args.steps} steps, save every "
          f"{args.save_interval}")  # fmt: skip
    for row in rows:
        saves = ", ".join(f"step {s}: blocked {b:.2f} s of {t:.2f} s" for s, b, t in row["saves"])
        extra = ", ".join(f"step {s}: +{x:.2f} s" for s, x in row["save_step_extra_s"])
        print(
            f"{row['label']:>8}: {saves or 'no per-save records (older tree)'}; save steps "
            f"beyond a usual step: {extra}; tokens/s near a "
            f"save {row['near_tokens_per_s'] or 0:,.0f}, far {row['far_tokens_per_s']:,.0f}; "
            f"host memory +{row['host_extra_gib']:.1f} GiB for a {row['checkpoint_gib']:.1f} GiB "
            f"checkpoint; resume: load {row['resume_load_s'] or float('nan'):.1f} s (checksums "
            f"{row['resume_verify_s'] or float('nan'):.1f} s), stage start "
            f"to resumed {row['stage_start_to_resumed_s']:.1f} s, to first step "
            f"{row['stage_start_to_first_step_s']:.1f} s; training stage {row['stage_wall_s']:.0f} s"
        )


if __name__ == "__main__":
    main()
