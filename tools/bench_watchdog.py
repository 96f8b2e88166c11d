"""What the hang watchdog costs a training that never hangs: the same run on CPU gloo ranks
(cluster.executor=subprocess), with progress reporting and the watchdog on (the default) and
off (resilience.hang_timeout_s=0), in alternating rounds; tokens/s from each run's DONE.json
(time in training steps only).

    python tools/bench_watchdog.py --workdir /tmp/bench_watchdog --rounds 5 --steps 300 \
        [--baseline-root /tmp/base]

--baseline-root: "off" is the pipeline at that folder (a checkout from before the watchdog,
progress reports and straggler timing existed) instead of this one with the watchdog off.

Prints each run's tokens/s, the medians and on/off; and, steadier than runs on a shared
machine, the cost of one progress report (the only work the watchdog adds to a step) times
the reports a step makes, against the measured step time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MODEL = [
    "data.builtin_corpus_bytes=600000",
    "data.num_shards=2",
    "tokenizer.vocab_size=512",
    "model.seq_length=128",
    "model.num_layers=2",
    "model.hidden_size=128",
    "model.num_attention_heads=4",
    "model.num_query_groups=2",
    "model.ffn_hidden_size=384",
    "train.micro_batch_size=4",
    "train.global_batch_size=16",
    "train.threads=1",
]
SETTINGS = {"off": ["resilience.hang_timeout_s=0"], "on": []}


def pipeline(*args: str, root: Path = ROOT) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "cluster=local", "-q", *args],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])


def report_cost_s(calls: int = 100_000) -> float:
    """Seconds per progress report, measured on a real report file."""
    import tempfile

    sys.path.insert(0, str(ROOT))
    from pipeline.resilience.progress import Reporter

    with tempfile.TemporaryDirectory() as folder:
        reporter = Reporter(Path(folder), 0)
        started = time.perf_counter()
        for i in range(calls):
            reporter.phase("forward-backward", i)
        return (time.perf_counter() - started) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--baseline-root", type=Path, default=None)
    args = parser.parse_args()
    data = args.workdir / "data_run"
    if not (data / "data").exists():
        pipeline(f"workdir={data}", *MODEL, "stages=[tokenize]")
    measured: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for round_ in range(args.rounds):
        for name, overrides in SETTINGS.items():
            workdir = args.workdir / f"{name}_{round_}_{int(time.time())}"
            pipeline(
                f"workdir={workdir}",
                *MODEL,
                f"data.prepared={data}",
                "stages=[train]",
                f"train.steps={args.steps}",
                f"train.eval_interval={args.steps}",
                "train.save_interval=0",
                "cluster.executor=subprocess",
                "cluster.tasks_per_node=2",
                *(overrides if args.baseline_root is None or name == "on" else []),
                root=args.baseline_root if args.baseline_root and name == "off" else ROOT,
            )
            done = json.loads((workdir / "train" / "DONE.json").read_text())
            measured[name].append(done["tokens_per_s"])
            print(f"round {round_} {name}: {done['tokens_per_s']:.1f} tokens/s", flush=True)
    medians = {name: statistics.median(v) for name, v in measured.items()}
    for name, values in measured.items():
        print(
            f"{name}: median {medians[name]:.1f} tokens/s ({' '.join(f'{v:.1f}' for v in values)})"
        )
    print(f"on/off: {medians['on'] / medians['off']:.4f}")
    micro_batches = 16 // 4 // 2  # global / micro / data-parallel ranks
    reports = 2 * micro_batches + 2  # data and forward-backward each, then data, optimizer
    step_s = 16 * 128 / medians["off"]
    cost = report_cost_s()
    print(
        f"one report {cost * 1e6:.2f} us; {reports} a step: {reports * cost * 1e6:.1f} us of a "
        f"{step_s * 1e3:.1f} ms step ({reports * cost / step_s:.4%})"
    )


if __name__ == "__main__":
    main()
