"""What the hang watchdog costs a training that never hangs: the same run on CPU gloo ranks
(cluster.executor=subprocess), with progress reporting and the watchdog on (the default) and
off (cluster.hang_timeout_s=0), in alternating rounds; tokens/s from each run's DONE.json
(time in training steps only).

    python tools/bench_watchdog.py --workdir /tmp/bench_watchdog --rounds 5 --steps 300

Prints each run's tokens/s, the medians and on/off.
"""

from __future__ import annotations

import argparse
import json
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
SETTINGS = {"off": ["cluster.hang_timeout_s=0"], "on": []}


def pipeline(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "cluster=local", "-q", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
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
                *overrides,
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


if __name__ == "__main__":
    main()
