"""The Transformer Engine path on real GPUs: the model learns in bf16 and fp8, resume continues
the loss curve, a kill during an asynchronous save resumes from the save before, the profiler
attributes device time, and 2-GPU data and tensor parallelism match the 1-GPU curve."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT

GPU_SMALL = [
    "train=gpu",
    "cluster.gpus_per_node=1",
    "data.builtin_corpus_bytes=1500000",
    "data.num_shards=2",
    "tokenizer.vocab_size=1024",
    "model.seq_length=256",
    "model.num_layers=4",
    "model.hidden_size=256",
    "model.num_attention_heads=8",
    "model.num_query_groups=4",
    "model.ffn_hidden_size=768",
    "train.micro_batch_size=8",
    "train.global_batch_size=16",
    "train.steps=60",
    "train.lr=1e-3",
    "train.min_lr=1e-4",
    "train.warmup_steps=5",
    "train.log_interval=1",
    "train.eval_interval=30",
    "train.save_interval=30",
    "train.eval_samples=32",
]


def pipeline(workdir: Path, *args: str) -> dict:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "cluster=local",
            f"workdir={workdir}",
            *GPU_SMALL,
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = workdir / "summary.json"
    return json.loads(summary.read_text()) if summary.exists() else {}


def curve(workdir: Path) -> dict[int, float]:
    lines = (workdir / "train" / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("gpu") / "base"
    pipeline(base, "stages=[tokenize]")
    return base


def with_data(data_dir: Path, workdir: Path) -> Path:
    workdir.mkdir(parents=True)
    for name in ("corpus", "tokenizer", "data"):
        shutil.copytree(data_dir / name, workdir / name, symlinks=True)
    return workdir


def close(a: dict[int, float], b: dict[int, float], rtol: float) -> bool:
    return a.keys() == b.keys() and all(abs(a[s] - b[s]) <= rtol * abs(a[s]) for s in a)


@pytest.fixture(scope="module")
def bf16_run(data_dir, tmp_path_factory) -> tuple[Path, dict]:
    """One whole bf16 run (train and evaluate): the reference curve for the other tests."""
    run = with_data(data_dir, tmp_path_factory.mktemp("gpu") / "bf16")
    return run, pipeline(run)


def test_bf16_trains_and_loss_falls(bf16_run):
    run, summary = bf16_run
    assert summary["last_train_loss"] < summary["first_train_loss"] - 1.0
    assert summary["test_ppl"] < summary["vocab_size"] / 4
    samples = json.loads((run / "eval" / "DONE.json").read_text())["samples"]
    assert samples and all(s["greedy"] for s in samples)


def resumed_from_step_30(reference: Path, run: Path, *args: str) -> dict[int, float]:
    """`reference` rerun from its step-30 checkpoint into `run`: the curve of steps 31-60."""
    shutil.copytree(reference, run, symlinks=True)
    shutil.rmtree(run / "checkpoints" / "iter_0000060")
    for path in ("train/DONE.json", "train/metrics.jsonl", "eval/DONE.json", "summary.json"):
        (run / path).unlink(missing_ok=True)
    pipeline(run, "stages=[tokenize,train]", *args)
    return curve(run)


def test_resume_reproduces_the_uninterrupted_loss_curve(bf16_run, tmp_path):
    reference, _ = bf16_run
    resumed = resumed_from_step_30(reference, tmp_path / "resume")
    assert sorted(resumed) == list(range(31, 61))
    uninterrupted = curve(reference)
    assert close(resumed, {s: uninterrupted[s] for s in resumed}, rtol=2e-3), (
        resumed,
        uninterrupted,
    )


def test_optimizer_state_gathered_for_any_layout_resumes_into_shards_saved_in_place(
    bf16_run, data_dir, tmp_path
):
    """train.reshardable_optimizer=true saves the distributed optimizer's state gathered
    ("fully_reshardable", as 0.3.0 always did); a resume with the default reads that format
    from the checkpoint, continues the uninterrupted curve, and saves shards in place."""
    from pipeline.model import dist_checkpoint

    reference, _ = bf16_run
    gathered = with_data(data_dir, tmp_path / "gathered")
    pipeline(gathered, "stages=[tokenize,train]", "train.reshardable_optimizer=true")
    saved = gathered / "checkpoints" / "iter_0000030"
    assert dist_checkpoint.saved_optimizer_format(saved) == "fully_reshardable"
    assert close(curve(gathered), curve(reference), rtol=2e-3)

    resumed = resumed_from_step_30(
        gathered, tmp_path / "resumed", "train.reshardable_optimizer=false"
    )
    assert sorted(resumed) == list(range(31, 61))
    uninterrupted = curve(reference)
    assert close(resumed, {s: uninterrupted[s] for s in resumed}, rtol=2e-3)
    again = tmp_path / "resumed" / "checkpoints" / "iter_0000060"
    assert dist_checkpoint.saved_optimizer_format(again) == "dp_reshardable"


def test_a_kill_while_an_async_save_is_in_flight_resumes_from_the_one_before(
    bf16_run, data_dir, tmp_path
):
    """A real asynchronous save on the GPU (device-to-host copy, forked writer): training goes
    on while it is written; killed then, the run resumes from the save before and continues
    the uninterrupted curve."""
    from pipeline.training import checkpoint
    from tests.cli.test_async_checkpoints import kill_with_a_save_in_flight

    reference, _ = bf16_run
    run = with_data(data_dir, tmp_path / "killed")
    args = [*GPU_SMALL, "train.save_interval=20", "stages=[tokenize,train]"]
    kill_with_a_save_in_flight(run, args, 40)
    root = run / "checkpoints"
    assert [p.name for p in checkpoint.finished(root)] == ["iter_0000020"]

    pipeline(run, "train.save_interval=20", "stages=[tokenize,train]")
    assert [p.name for p in checkpoint.finished(root)] == ["iter_0000040", "iter_0000060"]
    records = [json.loads(x) for x in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [r["resumed_from"] for r in records if "resumed_from" in r] == ["iter_0000020"]
    saves = [r for r in records if "checkpoint_blocked_s" in r]
    assert [r["step"] for r in saves] == [20, 40, 60]
    assert close(curve(run), curve(reference), rtol=2e-3)


def test_te_activation_kernels_checkpoint_and_resume(data_dir, tmp_path):
    reference = with_data(data_dir, tmp_path / "te-activation")
    pipeline(reference, "stages=[tokenize,train]", "train.te_activation=true")
    resumed = resumed_from_step_30(reference, tmp_path / "resumed", "train.te_activation=true")
    assert sorted(resumed) == list(range(31, 61))
    uninterrupted = curve(reference)
    assert close(resumed, {s: uninterrupted[s] for s in resumed}, rtol=2e-3)


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_fp8_runs_and_tracks_bf16(bf16_run, data_dir, tmp_path, recipe):
    fp8 = with_data(data_dir, tmp_path / f"fp8-{recipe}")
    pipeline(fp8, "stages=[tokenize,train]", "train.precision=fp8", f"train.fp8_recipe={recipe}")
    a, b = curve(bf16_run[0]), curve(fp8)
    tail = [s for s in a if s > 50]
    assert all(abs(a[s] - b[s]) <= 0.03 * a[s] for s in tail), (a, b)


def kernels(workdir: Path) -> str:
    lines = (workdir / "train" / "metrics.jsonl").read_text().splitlines()
    return [r["kernels"] for r in map(json.loads, lines) if "kernels" in r][-1]


def test_apex_accumulates_weight_gradients_and_tracks_the_curve_without_it(
    bf16_run, data_dir, tmp_path
):
    pytest.importorskip("fused_weight_gradient_mlp_cuda", reason="NVIDIA apex is not installed")
    run = bf16_run[0]
    assert "apex's fused kernel" in kernels(run), kernels(run)
    without = with_data(data_dir, tmp_path / "no-apex")
    pipeline(without, "stages=[tokenize,train]", "train.apex=false")
    assert "apex off: train.apex=false" in kernels(without), kernels(without)
    # the same sums, accumulated by another kernel: rounding apart, the same curve
    assert close(curve(run), curve(without), rtol=1e-2), (curve(run), curve(without))


def test_compiled_rope_tracks_transformer_engines(bf16_run, data_dir, tmp_path):
    run = bf16_run[0]
    assert "RoPE compiled over the unsplit QKV" in kernels(run), kernels(run)
    te_rope = with_data(data_dir, tmp_path / "te-rope")
    pipeline(te_rope, "stages=[tokenize,train]", "train.compiled_rope=false")
    assert "RoPE compiled" not in kernels(te_rope), kernels(te_rope)
    assert close(curve(run), curve(te_rope), rtol=2e-3), (curve(run), curve(te_rope))


def test_profiled_steps_show_where_device_time_goes(data_dir, tmp_path):
    run = with_data(data_dir, tmp_path / "profiled")
    pipeline(run, "stages=[tokenize,train]", "train.steps=8", "train.profile_steps=[5,6]")
    table = (run / "train" / "profile.txt").read_text()
    assert "| gemm |" in table and "| attention |" in table, table


def test_a_squared_relu_mlp_trains_in_transformer_engines_layers(data_dir, tmp_path):
    """model.activation=squared_relu: megatron-core's function inside TE's layers (TE's
    activation op has none), bf16: the loss falls as the SwiGLU model's does."""
    run = with_data(data_dir, tmp_path / "squared-relu")
    pipeline(run, "stages=[tokenize,train]", "model.activation=squared_relu", "train.steps=30")
    losses = curve(run)
    assert losses[30] < losses[1] - 1.0, losses


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize(
    "model,layout",
    [
        ([], ["parallel.tensor=1"]),
        ([], ["parallel.tensor=2"]),  # sequence parallelism on, as with any TP > 1
        # 3 layers, the embedding counted as a layer: a first stage of 1 layer, a last of 2
        (["model.num_layers=3"], ["parallel.pipeline=2", "parallel.account_for_embedding=true"]),
    ],
    ids=["dp2", "tp2", "pp2-uneven"],
)
def test_two_gpus_match_one_gpu(data_dir, tmp_path, model, layout):
    one = with_data(data_dir, tmp_path / "one")
    two = with_data(data_dir, tmp_path / "two")
    same_init = "train.init_on_cpu=true"  # the same initial weights under any TP layout
    pipeline(one, "stages=[tokenize,train]", same_init, *model)
    pipeline(
        two,
        "stages=[tokenize,train]",
        same_init,
        "cluster.executor=subprocess",
        "cluster.gpus_per_node=2",
        *model,
        *layout,
    )
    assert close(curve(one), curve(two), rtol=2e-2), (curve(one), curve(two))


def _evaluate(run: Path, *args: str) -> dict:
    (run / "eval" / "DONE.json").unlink(missing_ok=True)
    pipeline(run, "stages=[evaluate]", *args)
    return json.loads((run / "eval" / "DONE.json").read_text())


def test_a_gpu_checkpoint_evaluates_on_the_cpu(bf16_run, tmp_path):
    """Transformer Engine layers, bf16, written on the GPU; read by the CPU's layer spec in fp32."""
    run = tmp_path / "on-cpu"
    shutil.copytree(bf16_run[0], run, symlinks=True)
    on_gpu = json.loads((run / "eval" / "DONE.json").read_text())
    on_cpu = _evaluate(run, "train.device=cpu", "cluster.gpus_per_node=0", "eval.max_batches=8")
    assert on_cpu["gpus"] == 0 and on_cpu["checkpoint_layout"]["backend"] == "transformer_engine"
    on_gpu = _evaluate(run, "eval.max_batches=8")
    assert abs(on_cpu["test_loss"] - on_gpu["test_loss"]) <= 0.02 * on_gpu["test_loss"]


def test_a_tensor_parallel_cpu_checkpoint_evaluates_on_the_gpu(data_dir, tmp_path):
    """Written by two CPU ranks at parallel.tensor=2 without Transformer Engine, read by one
    GPU with Transformer Engine layers in the precision it was trained in (the run keeps its
    train.precision=fp32): the same test loss as on the CPU."""
    run = with_data(data_dir, tmp_path / "cpu-tp2")
    cpu = ["train.device=cpu", "train.precision=fp32", "cluster.gpus_per_node=0"]
    two_ranks = ["parallel.tensor=2", "cluster.executor=subprocess", "cluster.tasks_per_node=2"]
    pipeline(run, "stages=[tokenize,train]", "train.steps=10", *cpu, *two_ranks)
    on_cpu = _evaluate(run, "train.steps=10", *cpu, "eval.max_batches=8")
    on_gpu = _evaluate(run, "train.steps=10", "eval.max_batches=8")
    assert on_gpu["gpus"] == 1 and on_gpu["checkpoint_layout"]["tensor"] == 2
    assert abs(on_cpu["test_loss"] - on_gpu["test_loss"]) <= 0.02 * on_cpu["test_loss"]


def test_a_llama_continued_on_the_gpu_starts_from_its_weights(data_dir, tmp_path):
    """model.init_from on the Transformer Engine path: the weights load into the bf16 model
    and into the distributed optimizer's fp32 main copy (else its first step would write the
    random initial weights back). At a learning rate of 1e-9 the export after one step holds
    the Llama's weights, to bf16 rounding."""
    transformers = pytest.importorskip("transformers")
    import sentencepiece as spm
    from safetensors.torch import load_file

    llama = tmp_path / "llama"
    sp_model = data_dir / "tokenizer" / "tokenizer.model"
    config = transformers.LlamaConfig(
        vocab_size=spm.SentencePieceProcessor(model_file=str(sp_model)).vocab_size(),
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(llama)
    shutil.copyfile(sp_model, llama / "tokenizer.model")
    original = {n: p.detach().float() for n, p in model.state_dict().items()}

    workdir = tmp_path / "run"  # tokenized with the Llama's tokenizer.model
    pipeline(
        workdir,
        f"model.init_from={llama}",
        "stages=[tokenize,train,evaluate,export]",
        "train.steps=2",
        "train.warmup_steps=0",
        "train.lr=1e-9",
        "train.min_lr=0",
        "train.save_interval=2",
        "train.eval_interval=2",
        "export.dtype=fp32",
    )
    exported = {}
    for shard in sorted((workdir / "export").glob("*.safetensors")):
        exported.update(load_file(shard))
    assert exported.keys() == original.keys()
    for name, tensor in original.items():
        torch.testing.assert_close(exported[name], tensor, rtol=1e-2, atol=1e-5, msg=name)


def test_a_padded_vocabulary_reports_the_exported_models_perplexity(tmp_path):
    """1000 pieces, padded to 1024 rows: under Transformer Engine's fused cross-entropy the
    padding gets no probability either, so the evaluation's bf16 test perplexity is the exported
    bf16 model's in transformers, to bf16's unit roundoff (it was 0.1-0.7% off before)."""
    run = tmp_path / "padded"
    pipeline(
        run,
        "tokenizer.vocab_size=1000",
        "train.steps=30",
        "stages=[tokenize,train,evaluate,export]",
    )
    result = subprocess.run(
        [sys.executable, "tools/hf_perplexity.py", f"--workdir={run}", "--device=cuda"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    measured = json.loads(result.stdout)["sets"]["test"]
    assert measured["transformers_tokens"] == measured["pipeline_tokens"] > 0
    assert abs(measured["ppl_relative_difference"]) <= 2.0**-8, measured
