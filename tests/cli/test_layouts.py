"""Tensor- and pipeline-parallel training on CPU ranks (gloo, megatron-core's own parallel
layers and pipeline schedules), and checkpoints written under those layouts read back in one
process: the evaluation job runs on whatever it has, whatever layout trained the weights."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.data import datasets, evalsets
from pipeline.training import checkpoint
from tests.conftest import ROOT, SMALL_SERIAL, cli, copy_tokenized, make_config

TWO_RANKS = ["cluster.executor=subprocess", "cluster.tasks_per_node=2", "stages=[train]"]
LAYOUTS = {
    "single": [],
    "tensor2": ["parallel.tensor=2"],
    "single_4_layers": ["model.num_layers=4"],
    # two stages of two virtual stages each: megatron-core's interleaved schedule
    "pipeline2": ["parallel.pipeline=2", "parallel.virtual_pipeline=2", "model.num_layers=4"],
    "single_3_layers": ["model.num_layers=3"],
    # Megatron's uneven stages: the embedding counts as a layer, so 3 layers split as 1 + 2
    "pipeline2_uneven": [
        "parallel.pipeline=2",
        "parallel.account_for_embedding=true",
        "model.num_layers=3",
    ],
}
# each layout against one process training the same model
REFERENCE = {
    "tensor2": "single",
    "pipeline2": "single_4_layers",
    "pipeline2_uneven": "single_3_layers",
}


def _args(workdir: Path, name: str) -> list[str]:
    ranks = TWO_RANKS if name in REFERENCE else ["stages=[train]"]
    return [f"workdir={workdir}", *SMALL_SERIAL, *ranks, *LAYOUTS[name]]


@pytest.fixture(scope="module")
def runs(tokenized, finished_run, tmp_path_factory) -> dict[str, Path]:
    # one process with SMALL_SERIAL: the whole run the session has made already
    out = {"single": tmp_path_factory.mktemp("single") / "run"}
    shutil.copytree(finished_run.workdir, out["single"], symlinks=True)
    for name in [n for n in LAYOUTS if n not in out]:
        workdir = copy_tokenized(tokenized, tmp_path_factory.mktemp(name))
        result = cli(*_args(workdir, name))
        assert result.returncode == 0, result.stderr[-3000:]
        out[name] = workdir
    return out


def _metrics(workdir: Path, key: str) -> dict[int, float]:
    lines = (workdir / "train" / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r[key] for r in map(json.loads, lines) if key in r}


@pytest.mark.parametrize("name", REFERENCE)
def test_two_ranks_follow_the_single_process_curve(runs, name):
    """Weights are initialised whole and then split, and each layer from the seed and its
    place in the model, so every layout starts from one model; the gradient norm counts each
    shard once and each copied weight (norms) once; the interleaved schedule's activations
    and gradients, exchanged by two stages that are each other's both neighbours, are not
    crossed."""
    for key in ("loss", "grad_norm", "val_loss"):
        single, split = _metrics(runs[REFERENCE[name]], key), _metrics(runs[name], key)
        assert single.keys() == split.keys() and single, key
        for step in single:
            assert abs(single[step] - split[step]) <= 1e-4 * abs(single[step]), (key, step)


def test_tensor_parallel_weights_evaluate_in_one_process_as_the_same_model(runs):
    single = files.read_json(RunPaths.of(runs["single"]).eval_done)  # evaluated by its run
    result = cli(*_args(runs["tensor2"], "tensor2")[:-1], "stages=[evaluate]", *LAYOUTS["tensor2"])
    assert result.returncode == 0, result.stderr[-3000:]
    split = files.read_json(RunPaths.of(runs["tensor2"]).eval_done)
    assert split["checkpoint_layout"]["tensor"] == 2 and split["gpus"] == 0
    assert abs(split["test_loss"] - single["test_loss"]) <= 1e-4 * split["test_loss"]
    assert all(s["greedy"] for s in split["samples"])  # decoded in one process too


def test_pipeline_stage_checkpoint_in_one_process_gives_the_stages_validation_loss(runs):
    """The validation loss the two stages (four model chunks) logged at step 20, recomputed
    from their checkpoint by one process holding the whole model."""
    from pipeline.evaluation.evaluate import single_device
    from pipeline.training.engine import Engine

    workdir = runs["pipeline2"]
    cfg = make_config(workdir, *SMALL_SERIAL, *TWO_RANKS, *LAYOUTS["pipeline2"])
    folder = RunPaths.of(workdir).checkpoints / checkpoint.folder_name(20)
    state = files.read_json(folder / "state.json")
    assert state["layout"]["pipeline"] == 2 and state["layout"]["virtual_pipeline"] == 2
    local = single_device(cfg)
    manifest = datasets.load_manifest(RunPaths.of(workdir))
    engine = Engine(local, manifest["vocab_size"], state["layout"]["padded_vocab_size"])
    assert len(engine.chunks) == 1
    checkpoint.load(folder, engine.backend, engine.chunks, None)
    [validation] = evalsets.validation_sets(local, manifest, engine.dp_size).values()
    loss, _ = engine.loss_over(validation, cfg.train.micro_batch_size, None)
    assert abs(loss - state["val_loss"]) <= 1e-5 * loss, (loss, state["val_loss"])


def _scoring_requests(sp, workdir: Path, count: int = 21) -> list[tuple[list[int], list[int]]]:
    """(context, continuation) token ids of many lengths cut from the corpus's last documents,
    a few batches' worth."""
    lines = (workdir / "corpus" / "builtin.jsonl").read_text().splitlines()[-count:]
    rng = random.Random(3)
    pairs = []
    for line in lines:
        ids = sp.encode(json.loads(line)["text"])[:60]
        cut = rng.randint(1, min(50, len(ids) - 2))
        pairs.append((ids[:cut], ids[cut : cut + rng.randint(1, 6)]))
    return pairs


def _latest(workdir: Path | str) -> Path:
    paths = RunPaths.of(workdir)
    return paths.checkpoints / paths.latest_checkpoint()


def _scoring_rank(rank: int, port: int, workdir: str, out: str) -> None:
    """One of a downstream job's two ranks: the tensor-parallel run's checkpoint scored in the
    job's layout."""
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from megatron.core import parallel_state

    from pipeline.evaluation.downstream import scoring_model

    cfg = make_config(workdir, *SMALL_SERIAL, *TWO_RANKS, *LAYOUTS["tensor2"])
    model = scoring_model(cfg, _latest(workdir))
    pairs = _scoring_requests(model.sp, Path(workdir))
    contexts = [context for context, _ in pairs[:6]]
    found = {
        "tensor": parallel_state.get_tensor_model_parallel_world_size(),
        "data": model.engine.dp_size,
        "scores": model.scorer.loglikelihoods(pairs, cfg.model.seq_length),
        "greedy": model.scorer.greedy(contexts, 4, model.sp.eos_id(), lambda ids: False),
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(found))


def test_a_tensor_parallel_checkpoint_scores_under_two_ranks_as_in_one_process(runs, tmp_path):
    """A downstream job of two ranks holds the model trained with parallel.tensor=2 as it was
    trained, the vocabulary's logits gathered from both before the log-softmax (its padded rows
    left out): each request's log-likelihood, and whether greedy decoding yields it, as one
    process holding the whole model scores them."""
    import torch.multiprocessing as mp

    from pipeline.evaluation.downstream import scoring_model

    workdir = runs["tensor2"]
    port = 29500 + os.getpid() % 1000
    mp.start_processes(
        _scoring_rank, args=(port, str(workdir), str(tmp_path)), nprocs=2, start_method="spawn"
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [(r["tensor"], r["data"]) for r in ranks] == [(2, 1), (2, 1)]
    assert ranks[0]["scores"] == ranks[1]["scores"] and ranks[0]["greedy"] == ranks[1]["greedy"]
    cfg = make_config(workdir, *SMALL_SERIAL, *TWO_RANKS, *LAYOUTS["tensor2"])
    alone = scoring_model(cfg, _latest(workdir))
    assert alone.engine.settled.tensor == 1 and alone.state["layout"]["tensor"] == 2
    pairs = _scoring_requests(alone.sp, workdir)
    expected = alone.scorer.loglikelihoods(pairs, cfg.model.seq_length)
    for (logprob, greedy), (one, one_greedy) in zip(ranks[0]["scores"], expected, strict=True):
        assert abs(logprob - one) <= 1e-5 and greedy == one_greedy
    contexts = [context for context, _ in pairs[:6]]
    continued = alone.scorer.greedy(contexts, 4, alone.sp.eos_id(), lambda ids: False)
    assert continued == ranks[0]["greedy"] and any(continued)
    own = [(c, ids) for c, ids in zip(contexts, continued, strict=True) if ids]
    assert all(g for _, g in alone.scorer.loglikelihoods(own, cfg.model.seq_length))


ONE_PROCESS = [
    "cluster.executor=inprocess",
    "cluster.tasks_per_node=1",
    "parallel.tensor=1",
    "parallel.pipeline=1",
    "parallel.virtual_pipeline=null",
]


@pytest.mark.parametrize("name", ["tensor2", "pipeline2", "pipeline2_uneven"])
def test_a_run_saved_by_two_ranks_continues_in_one_process_on_the_same_curve(runs, name, tmp_path):
    """Saved at step 20 by two ranks (tensor- or pipeline-parallel, even or uneven stages),
    continued to step 30 in one process: weights, AdamW's moments and step count, the schedule
    and the data position load under the other layout (each layer found under its place in
    the whole model), and the losses are those of the same run continued under its own
    layout."""
    continued = {}
    for where, layout in (("own layout", []), ("one process", ONE_PROCESS)):
        workdir = tmp_path / where.replace(" ", "-")
        shutil.copytree(runs[name], workdir, symlinks=True)
        # the run's own overrides are replayed (runs.jsonl); these come after them
        result = cli(f"workdir={workdir}", "stages=[train]", "train.steps=30", *layout)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "at step 20" in result.stderr and "resumed from" in result.stderr
        continued[where] = _metrics(workdir, "loss")
    ours, reference = continued["one process"], continued["own layout"]
    later = [step for step in reference if step > 20]
    assert later and [s for s in ours if s > 20] == later
    for step in later:
        assert abs(ours[step] - reference[step]) <= 1e-4 * abs(reference[step]), step
    ranks = json.loads(RunPaths.of(tmp_path / "one-process").ranks.read_text())["attempts"]
    assert [len(a["ranks"]) for a in ranks] == [2, 1]  # two ranks saved it, one continued


def test_pipeline_stages_on_cpu_with_tied_embeddings_are_refused_before_anything_runs(tmp_path):
    result = cli(
        f"workdir={tmp_path / 'run'}",
        "parallel.pipeline=2",
        "model.untie_embeddings=false",
        "cluster.tasks_per_node=2",
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: parallel.pipeline: ") and result.stderr.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_context_parallelism_on_cpu_is_refused_before_anything_runs(tmp_path):
    result = cli(f"workdir={tmp_path / 'run'}", "parallel.context=2", "cluster.tasks_per_node=2")
    assert result.returncode == 2
    assert result.stderr.startswith("error: parallel.context: context parallelism needs GPUs")
    assert result.stderr.count("\n") == 1 and not (tmp_path / "run").exists()


def test_a_layout_that_pads_the_vocabulary_otherwise_is_refused_before_anything_runs(
    tokenized, tmp_path
):
    """Weights and optimizer state load under any layout, but the embedding's shape is the
    vocabulary padded to a multiple of make_vocab_size_divisible_by x parallel.tensor: 512
    tokens pad to 576 in one process and to 768 under two tensor-parallel ranks."""
    workdir = copy_tokenized(tokenized, tmp_path / "run")
    padded = ["model.make_vocab_size_divisible_by=192", "train.steps=10", "train.save_interval=10"]
    first = cli(f"workdir={workdir}", *SMALL_SERIAL, "stages=[train]", *padded)
    assert first.returncode == 0, first.stderr[-3000:]
    (workdir / "train" / "DONE.json").unlink()  # as if stopped after its checkpoint
    before = sorted(p.relative_to(workdir) for p in workdir.rglob("*"))
    refused = cli(f"workdir={workdir}", "train.steps=20", "parallel.tensor=2", *TWO_RANKS)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr == (
        "error: parallel.tensor: the checkpoint to resume was saved under parallel.tensor=1, "
        "parallel.pipeline=1, parallel.virtual_pipeline=None with the vocabulary padded to 576; "
        "this layout pads it to 768 (model.make_vocab_size_divisible_by x parallel.tensor), "
        "another embedding shape; choose a tensor-parallel size that pads it the same\n"
    )
    assert sorted(p.relative_to(workdir) for p in workdir.rglob("*")) == before


def _export(workdir: Path, out: Path) -> dict:
    """`python -m pipeline.export` of the run, in fp32; its tensors by name."""
    from safetensors.torch import load_file

    result = subprocess.run(
        [sys.executable, "-m", "pipeline.export", f"workdir={workdir}", f"out={out}"]
        + ["export.dtype=fp32", "eval.checkpoint=latest"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    tensors = {}
    for shard in sorted(out.glob("*.safetensors")):
        tensors.update(load_file(shard))
    return tensors


@pytest.mark.parametrize("name", ["tensor2", "pipeline2"])
def test_a_checkpoint_of_two_ranks_exports_to_the_model_one_process_trains(runs, name, tmp_path):
    """The export reads a checkpoint whole, whatever layout wrote it: two tensor-parallel
    ranks, or two pipeline stages of two virtual stages each, give the model of the same
    training in one process (as close as their loss curves: summed in another order)."""
    split = _export(runs[name], tmp_path / name)
    single = _export(runs[REFERENCE[name]], tmp_path / "single")
    assert split.keys() == single.keys() and split
    for key, tensor in single.items():
        assert split[key].shape == tensor.shape, key
        assert (split[key] - tensor).abs().max() <= 1e-3, key
