"""Training throughput on a GPU host: the pipeline's real training stage beside a hand-written
megatron-core loop (tools/megatron_loop.py) and Hugging Face transformers baselines of the same
shape, measured in one run.

    python tools/bench_train.py --workdir /tmp/bench \
        --stage "gpt-1.3b mb=16 ga=4" --stage "gpt-1.3b mb=16 ga=4 train.precision=fp8" \
        --baselines loop trainer

Each --stage is a model name, mb= (micro-batch), ga= (accumulation) and any pipeline
overrides. For each it prints tokens/s, TFLOP/s per GPU and MFU (Megatron-LM's FLOP formula,
peak 989 TFLOP/s bf16 on H100/H200), the measured peak memory beside the planner's estimate
(`pipeline.planning`) for that config, for the training stage (this project); and, per model, a
plain transformers loop (LlamaForCausalLM, SDPA, bf16 weights, fused AdamW) and
transformers.Trainer with bf16. Medians over the timed steps, after warm-up steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SEQ = 2048
VOCAB = 32000


def stage_overrides(model: str, micro: int, global_batch: int, steps: int) -> list[str]:
    return [
        "cluster=local",
        "train=gpu",
        "cluster.gpus_per_node=1",
        f"model={model}",
        f"model.seq_length={SEQ}",
        f"tokenizer.vocab_size={VOCAB}",
        f"train.micro_batch_size={micro}",
        f"train.global_batch_size={global_batch}",
        f"train.steps={steps}",
        "train.warmup_steps=1",
        "train.log_interval=1",
        f"train.eval_interval={steps}",
        "train.save_interval=0",  # no checkpoint writes in a throughput run
        "train.eval_samples=1",
        "data.num_shards=1",
        "data.split='96,2,2'",
        "stages=[tokenize,train]",
    ]


AUTO = ["train.micro_batch_size=auto", "train.recompute=auto"]


@dataclass
class StageRun:
    """One --stage: model, micro-batch (None: auto, the planner's), global batch and any other
    overrides."""

    model: str
    micro: int | None
    global_batch: int
    extra: list[str]

    @classmethod
    def parse(cls, spec: str) -> StageRun:
        """ "gpt-1.3b mb=16 ga=4 KEY=VALUE ...", or "gpt-1.3b mb=auto gb=64 ..."."""
        model, *rest = spec.split()
        micro, accumulation, global_batch, extra = "16", 4, None, []
        for item in rest:
            key, _, value = item.partition("=")
            if key == "mb":
                micro = value
            elif key == "ga":
                accumulation = int(value)
            elif key == "gb":
                global_batch = int(value)
            else:
                extra.append(item)
        if micro == "auto":
            return cls(model, None, global_batch or 64, extra)
        return cls(model, int(micro), global_batch or int(micro) * accumulation, extra)

    @property
    def label(self) -> str:
        if self.micro is None:
            batch = f"auto gb{self.global_batch}"
        else:
            batch = f"mb{self.micro}x{self.global_batch // self.micro}"
        return " ".join([batch, *self.extra])

    def overrides(self, steps: int) -> list[str]:
        base = stage_overrides(self.model, self.micro or 1, self.global_batch, steps)
        return [*base, *(AUTO if self.micro is None else []), *self.extra]


def resolved(workdir: Path) -> dict:
    """The micro-batch and recompute the run's config.yaml records (auto ones as chosen)."""
    from pipeline.config import read

    cfg = read(workdir / "config.yaml")
    return {"micro_batch_size": cfg.train.micro_batch_size, "recompute": cfg.train.recompute}


def planned_memory_gib(overrides: list[str]) -> float:
    """The planner's estimate of torch's peak allocation for the config (total - overhead)."""
    from pipeline.config import compose
    from pipeline.planning import auto
    from pipeline.planning.memory import memory_per_gpu
    from pipeline.planning.parallel_layout import ParallelLayout

    cfg = compose("/tmp/unused", *overrides, settle=auto.settle)
    layout = ParallelLayout.of(cfg)
    memory = memory_per_gpu(cfg.model, layout.model_figures(cfg.model, VOCAB), layout)
    return (memory["total"] - memory["overhead"]) / 2**30


def run_stage(workdir: Path, run: StageRun, steps: int, warmup: int, data: Path) -> dict:
    """The real training stage as users run it; throughput from its metrics after warm-up."""
    workdir.mkdir(parents=True, exist_ok=True)
    for name in ("corpus", "tokenizer", "data"):
        if not (workdir / name).exists():
            (workdir / name).symlink_to((data / name).resolve())
    overrides = run.overrides(warmup + steps)
    cmd = [sys.executable, "-m", "pipeline", f"workdir={workdir}", *overrides]
    started = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    (workdir / "stage.log").write_text(proc.stderr)
    if proc.returncode != 0:
        return {"error": proc.stderr[-1500:]}
    records = [
        json.loads(line) for line in (workdir / "train" / "metrics.jsonl").read_text().splitlines()
    ]
    timed = [r for r in records if "tokens_per_s" in r and r["step"] > warmup]
    peak = max(r.get("peak_mem_gib", 0.0) for r in timed)
    planned = planned_memory_gib(overrides)
    return {
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in timed),
        "tflops_per_gpu": statistics.median(r["tflops_per_gpu"] for r in timed),
        "mfu": statistics.median(r.get("mfu", 0.0) for r in timed),
        "peak_mem_gib": peak,
        "planned_mem_gib": planned,
        "memory_error": (planned - peak) / peak if peak else None,
        "final_loss": timed[-1]["loss"],
        "losses": {r["step"]: r["loss"] for r in records if "loss" in r},
        "wall_s": time.time() - started,
        "command": " ".join(cmd[1:]),
        **resolved(workdir),
    }


def prepare_data(base: Path, model: str) -> Path:
    """Built-in corpus tokenized with a 32k BPE: real tokens for every run of the benchmark."""
    if not (base / "data" / "manifest.json").exists():
        cmd = [
            sys.executable,
            "-m",
            "pipeline",
            f"workdir={base}",
            *stage_overrides(model, 1, 1, 10),
            "stages=[tokenize]",
        ]
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    return base


def llama_config(model: str):
    """The model config of the same shape, as a transformers LlamaConfig."""
    from transformers import LlamaConfig

    from pipeline.config import compose
    from pipeline.model.sizes import ffn_hidden_size

    m = compose("/tmp/unused", f"model={model}", check=False).model
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=m.hidden_size,
        intermediate_size=ffn_hidden_size(m),
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_attention_heads,
        num_key_value_heads=m.num_query_groups or m.num_attention_heads,
        max_position_embeddings=SEQ,
        tie_word_embeddings=not m.untie_embeddings,
        attn_implementation="sdpa",
        torch_dtype="bfloat16",
    )


def flops_per_token(model: str, vocab: int = VOCAB) -> float:
    """Megatron-LM's training FLOPs per token (a MoE model's by its active experts)."""
    from pipeline.config import compose
    from pipeline.model.flops import flops_per_sequence

    cfg = compose("/tmp/unused", f"model={model}", f"model.seq_length={SEQ}", check=False)
    return flops_per_sequence(cfg.model, vocab, cfg.parallel.tensor) / SEQ


def _summary(model: str, step_seconds: list[float], micro: int, mem: float) -> dict:
    seconds = statistics.median(step_seconds)
    tokens = micro * SEQ / seconds
    tflops = tokens * flops_per_token(model) / 1e12
    return {
        "tokens_per_s": tokens,
        "tflops_per_gpu": tflops,
        "mfu": tflops / 989.0,
        "peak_mem_gib": mem,
    }


def hf_loop(model: str, micro: int, steps: int, warmup: int) -> dict:
    """The plain transformers loop: bf16 weights, SDPA attention, fused AdamW."""
    import torch
    from transformers import LlamaForCausalLM

    torch.cuda.reset_peak_memory_stats()
    net = LlamaForCausalLM(llama_config(model)).to("cuda", torch.bfloat16)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=True)
    times = []
    for i in range(warmup + steps):
        batch = torch.randint(0, VOCAB, (micro, SEQ), device="cuda")
        torch.cuda.synchronize()
        t = time.perf_counter()
        loss = net(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t)
    return _summary(model, times, micro, torch.cuda.max_memory_allocated() / 2**30)


def hf_trainer(model: str, micro: int, steps: int, warmup: int, out: Path) -> dict:
    """transformers.Trainer with bf16 mixed precision (fp32 weights), as most users run it."""
    import torch
    from transformers import LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    class Timer(TrainerCallback):
        def __init__(self):
            self.times, self.t = [], 0.0

        def on_step_begin(self, args, state, control, **kw):
            torch.cuda.synchronize()
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            torch.cuda.synchronize()
            self.times.append(time.perf_counter() - self.t)

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return micro * (warmup + steps)

        def __getitem__(self, i):
            ids = torch.randint(0, VOCAB, (SEQ,))
            return {"input_ids": ids, "labels": ids}

    torch.cuda.reset_peak_memory_stats()
    config = llama_config(model)
    config.torch_dtype = "float32"
    net = LlamaForCausalLM(config)
    timer = Timer()
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=micro,
        max_steps=warmup + steps,
        bf16=True,
        optim="adamw_torch_fused",
        learning_rate=1e-4,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        dataloader_num_workers=2,
    )
    Trainer(model=net, args=args, train_dataset=Tokens(), callbacks=[timer]).train()
    return _summary(model, timer.times[warmup:], micro, torch.cuda.max_memory_allocated() / 2**30)


def baseline_subprocess(
    kind: str, model: str, micro: int, steps: int, warmup: int, out: Path
) -> dict:
    """Each baseline in its own process so memory and kernels do not carry over."""
    cmd = [
        sys.executable,
        __file__,
        "--baseline",
        kind,
        "--models",
        model,
        "--micro-batch",
        str(micro),
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
        "--workdir",
        str(out),
    ]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0")}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"error": proc.stderr[-1500:]}


def precision(run: StageRun) -> str:
    return "fp8" if "train.precision=fp8" in run.extra else "bf16"


def megatron_subprocess(run: StageRun, micro: int, steps: int, warmup: int) -> dict:
    """tools/megatron_loop.py at the stage row's batch (`micro`: as the stage ran it) and
    precision."""
    cmd = [sys.executable, str(ROOT / "tools" / "megatron_loop.py"), "--model", run.model,
           "--micro-batch", str(micro), "--accumulation", str(run.global_batch // micro),
           "--precision", precision(run), "--steps", str(steps), "--warmup", str(warmup)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"error": proc.stderr[-1500:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--stage",
        action="append",
        help='e.g. "gpt-1.3b mb=16 ga=4 train.precision=fp8" (repeatable)',
    )
    parser.add_argument("--models", nargs="+", default=["gpt-350m", "gpt-1.3b"])
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--hf-micro-batch", type=int, nargs="+", default=None)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--baselines", nargs="*", default=["megatron", "loop", "trainer"])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench-train"))
    parser.add_argument("--data", type=Path, help="a tokenized run folder (32k vocab) to reuse")
    parser.add_argument("--baseline", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.baseline:  # child process of one baseline
        model, micro = args.models[0], args.micro_batch
        if args.baseline == "loop":
            result = hf_loop(model, micro, args.steps, args.warmup)
        else:
            result = hf_trainer(model, micro, args.steps, args.warmup, args.workdir)
        print(json.dumps(result))
        return

    import torch

    print(
        f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}",
        flush=True,
    )
    runs = [StageRun.parse(spec) for spec in args.stage or [f"{m} mb=16 ga=4" for m in args.models]]
    models = list(dict.fromkeys(r.model for r in runs))
    rows, by_hand = [], set()
    for index, run in enumerate(runs):
        data = args.data or prepare_data(args.workdir / "data-32k", run.model)
        result = run_stage(args.workdir / f"stage-{index}", run, args.steps, args.warmup, data)
        rows.append((run.model, f"pipeline stage {run.label}", result))
        print(json.dumps({"model": run.model, "run": rows[-1][1], **result}), flush=True)
        # the same batch and precision by hand, once for the stage rows that share them
        shape = (run.model, run.global_batch, result.get("micro_batch_size"), precision(run))
        if "megatron" in args.baselines and "error" not in result and shape not in by_hand:
            by_hand.add(shape)
            result = megatron_subprocess(run, result["micro_batch_size"], args.steps, args.warmup)
            rows.append((run.model, f"megatron-core loop {run.label}", result))
            print(json.dumps({"model": run.model, "run": rows[-1][1], **result}), flush=True)
    hf_kinds = [kind for kind in args.baselines if kind != "megatron"]
    for model in models:
        for kind, micro in zip(hf_kinds, args.hf_micro_batch or [16] * 2, strict=False):
            result = baseline_subprocess(
                kind, model, micro, args.steps, args.warmup, args.workdir / f"hf-{kind}-{model}"
            )
            rows.append((model, f"transformers {kind} bf16 mb{micro}", result))
            print(json.dumps({"model": model, "run": rows[-1][1], **result}), flush=True)
    print_table(rows)


def print_table(rows: list[tuple[str, str, dict]]) -> None:
    """Markdown: each row's throughput, memory (with the plan's estimate) and its ratio to the
    model's first stage row."""
    print("\n| model | run | tokens/s | TFLOP/s/GPU | MFU | peak GiB | planned GiB | "
          "plan error | first stage row / this | loss vs first row of its batch |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model, name, r in rows:
        if "error" in r:
            last = r["error"].strip().splitlines()[-1] if r["error"].strip() else "?"
            print(f"| {model} | {name} | failed: {last[:200]} |")
            continue
        ref = next(
            (x for m, n, x in rows if m == model and n.startswith("pipeline") and "error" not in x),
            None,
        )
        ratio = f"{ref['tokens_per_s'] / r['tokens_per_s']:.2f}x" if ref else "-"
        same_batch = next(
            (x for m, n, x in rows if m == model and n.split()[:3] == name.split()[:3]), None
        )
        planned = r.get("planned_mem_gib")
        error = r.get("memory_error")
        print(
            f"| {model} | {name} | {r['tokens_per_s']:,.0f} | {r['tflops_per_gpu']:.0f} | "
            f"{100 * r['mfu']:.1f}% | {r['peak_mem_gib']:.1f} | "
            f"{f'{planned:.1f}' if planned else '-'} | "
            f"{f'{100 * error:+.1f}%' if error is not None else '-'} | {ratio} | "
            f"{loss_gap(same_batch, r)} |"
        )


def loss_gap(reference: dict | None, run: dict) -> str:
    """Largest relative difference of the loss from the reference row's, over the second half
    of the steps (the same data, seed and batch: only the kernels or precision differ)."""
    if not reference or reference is run or "losses" not in run or "losses" not in reference:
        return "-"
    steps = sorted(set(reference["losses"]) & set(run["losses"]))
    tail = steps[len(steps) // 2 :]
    if not tail:
        return "-"
    gap = max(abs(run["losses"][s] - reference["losses"][s]) / reference["losses"][s] for s in tail)
    return f"{100 * gap:.2f}% (steps {tail[0]}-{tail[-1]})"


if __name__ == "__main__":
    main()
