"""Training throughput on a GPU host: the pipeline's real training stage beside Hugging Face
transformers baselines of the same shape, measured in one run.

    python tools/bench_train.py --models gpt-350m gpt-1.3b --workdir /tmp/bench

For each model it prints tokens/s, TFLOP/s per GPU and MFU (Megatron-LM's FLOP formula,
peak 989 TFLOP/s bf16 on H100/H200) and peak memory, for: the training stage (this project);
a plain transformers loop (LlamaForCausalLM, SDPA, bf16 weights, fused AdamW); and
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SEQ = 2048
VOCAB = 32000


def stage_overrides(
    model: str, micro: int, global_batch: int, steps: int, precision: str
) -> list[str]:
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
        f"train.save_interval={steps}",
        "train.eval_iters=1",
        f"train.precision={precision}",
        "data.num_shards=1",
        "data.split='96,2,2'",
        "stages=[tokenize,train]",
    ]


def run_stage(
    workdir: Path,
    model: str,
    micro: int,
    global_batch: int,
    steps: int,
    warmup: int,
    precision: str,
    data: Path,
) -> dict:
    """The real training stage as users run it; throughput from its metrics after warm-up."""
    workdir.mkdir(parents=True, exist_ok=True)
    for name in ("corpus", "tokenizer", "data"):
        if not (workdir / name).exists():
            (workdir / name).symlink_to(data / name)
    cmd = [
        sys.executable,
        "-m",
        "pipeline",
        f"workdir={workdir}",
        *stage_overrides(model, micro, global_batch, steps, precision),
    ]
    started = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr[-1500:]}
    records = [
        json.loads(line) for line in (workdir / "train" / "metrics.jsonl").read_text().splitlines()
    ]
    timed = [r for r in records if "tokens_per_s" in r and r["step"] > warmup]
    return {
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in timed),
        "tflops_per_gpu": statistics.median(r["tflops_per_gpu"] for r in timed),
        "mfu": statistics.median(r.get("mfu", 0.0) for r in timed),
        "peak_mem_gib": max(r.get("peak_mem_gib", 0.0) for r in timed),
        "final_loss": records[-1].get("loss") or timed[-1]["loss"],
        "wall_s": time.time() - started,
        "command": " ".join(cmd[1:]),
    }


def prepare_data(base: Path, model: str) -> Path:
    """Built-in corpus tokenized with a 32k BPE: real tokens for every run of the benchmark."""
    if not (base / "data" / "manifest.json").exists():
        cmd = [
            sys.executable,
            "-m",
            "pipeline",
            f"workdir={base}",
            *stage_overrides(model, 1, 1, 10, "bf16"),
            "stages=[tokenize]",
        ]
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    return base


def llama_config(model: str):
    """The model config of the same shape, as a transformers LlamaConfig."""
    from transformers import LlamaConfig

    from pipeline.model import ffn_hidden_size
    from tests.conftest import make_config

    m = make_config("/tmp/unused", f"model={model}", validate=False).model
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


def flops_per_token(model: str) -> float:
    from pipeline.flops import flops_per_sequence
    from tests.conftest import make_config

    cfg = make_config("/tmp/unused", f"model={model}", f"model.seq_length={SEQ}", validate=False)
    return flops_per_sequence(cfg, VOCAB) / SEQ


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt-350m", "gpt-1.3b"])
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--hf-micro-batch", type=int, default=None)
    parser.add_argument("--accumulation", type=int, default=4)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--precision", nargs="+", default=["bf16"])
    parser.add_argument("--baselines", nargs="*", default=["loop", "trainer"])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench-train"))
    parser.add_argument("--baseline", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.baseline:  # child process of one baseline
        fn = hf_loop if args.baseline == "loop" else None
        model = args.models[0]
        result = (
            fn(model, args.micro_batch, args.steps, args.warmup)
            if fn
            else hf_trainer(model, args.micro_batch, args.steps, args.warmup, args.workdir)
        )
        print(json.dumps(result))
        return

    import torch

    print(
        f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}",
        flush=True,
    )
    rows = []
    for model in args.models:
        data = prepare_data(args.workdir / "data-32k", model)
        for precision in args.precision:
            gb = args.micro_batch * args.accumulation
            result = run_stage(
                args.workdir / f"{model}-{precision}",
                model,
                args.micro_batch,
                gb,
                args.warmup + args.steps,
                args.warmup,
                precision,
                data,
            )
            rows.append(
                (
                    model,
                    f"pipeline stage {precision} mb{args.micro_batch}x{args.accumulation}",
                    result,
                )
            )
            print(json.dumps({"model": model, "run": rows[-1][1], **result}), flush=True)
        hf_micro = args.hf_micro_batch or args.micro_batch
        for kind in args.baselines:
            result = baseline_subprocess(
                kind, model, hf_micro, args.steps, args.warmup, args.workdir / f"hf-{kind}-{model}"
            )
            rows.append((model, f"transformers {kind} bf16 mb{hf_micro}", result))
            print(json.dumps({"model": model, "run": rows[-1][1], **result}), flush=True)

    print("\n| model | run | tokens/s | TFLOP/s/GPU | MFU | peak GiB | vs stage |")
    print("|---|---|---|---|---|---|---|")
    for model, name, r in rows:
        if "error" in r:
            print(
                f"| {model} | {name} | failed: {r['error'].splitlines()[-1] if r['error'] else '?'} |"
            )
            continue
        ref = next(
            (
                x
                for m, n, x in rows
                if m == model and n.startswith("pipeline stage bf16") and "error" not in x
            ),
            None,
        )
        ratio = f"{ref['tokens_per_s'] / r['tokens_per_s']:.2f}x" if ref else "-"
        print(
            f"| {model} | {name} | {r['tokens_per_s']:,.0f} | {r['tflops_per_gpu']:.0f} | "
            f"{100 * r['mfu']:.1f}% | {r['peak_mem_gib']:.1f} | {ratio} |"
        )


if __name__ == "__main__":
    main()
