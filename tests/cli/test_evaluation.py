"""Evaluation and model selection after a real pipeline run: the best checkpoint, test and
extra-set perplexities recomputed from the documents alone, the report, job accounting, and a
sweep's comparison. One run (resumed once, as after a crash) serves every test."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipeline.core.paths import RunPaths
from pipeline.data import datasets
from pipeline.model import dist_checkpoint
from tests.cli.test_pipeline import pipeline
from tests.conftest import ROOT, SMALL_SERIAL, make_config

EXTRA_BAD_LINES = ["{not json", json.dumps({"body": "no text key"})]


def _extra_set(folder: Path) -> Path:
    """Real text (this project's own sources) as JSONL, with two bad records."""
    folder.mkdir(parents=True)
    sources = sorted((ROOT / "pipeline" / "data").glob("[a-f]*.py"))[:3]
    lines = [json.dumps({"text": p.read_text()[:4000]}) for p in sources] + EXTRA_BAD_LINES
    (folder / "code.jsonl").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("evaluation")
    extra = _extra_set(root / "extra")
    workdir = root / "run"
    args = [
        f"workdir={workdir}",
        *SMALL_SERIAL,
        f"+eval.extra_sets={{code: {extra}/*.jsonl}}",
        "eval.all_checkpoints=true",
    ]
    pipeline(*args, "stages=[tokenize,train]")
    # as if the training job had died after its step-10 checkpoint: the rerun resumes from it
    shutil.rmtree(workdir / "checkpoints" / "iter_0000020")
    (workdir / "train" / "DONE.json").unlink()
    result = pipeline(*args)
    assert "resumed from" in result.stderr
    return workdir, args


def _evaluation(workdir: Path) -> dict:
    return json.loads((workdir / "eval" / "DONE.json").read_text())


@pytest.fixture(scope="module")
def fresh_model(run):
    """The best checkpoint's weights in a GPTModel built here, and the run's tokenizer."""
    from megatron.core import parallel_state

    from pipeline.data.tokenizer import load
    from pipeline.model import gpt
    from pipeline.model.backends.cpu import CpuBackend
    from pipeline.runtime import distributed

    workdir, _ = run
    cfg = make_config(workdir, *SMALL_SERIAL)
    manifest = datasets.load_manifest(RunPaths.of(cfg.workdir))
    distributed.init("gloo")
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    net = gpt.build(cfg, manifest["vocab_size"], CpuBackend())
    best = Path(_evaluation(workdir)["checkpoint"])
    dist_checkpoint.load_weights(best, [net])
    net.eval()
    return cfg, net, load(workdir / "tokenizer" / "tokenizer.model")


@torch.no_grad()
def _mean_loss(net, stream: np.ndarray, seq_length: int) -> tuple[float, int]:
    """Mean next-token loss over the stream, cut into windows of seq_length + 1 tokens that
    overlap by one (every token after the first predicted once)."""
    total, count = 0.0, 0
    for begin in range(0, len(stream) - 1, seq_length):
        chunk = torch.from_numpy(stream[begin : begin + seq_length + 1].astype(np.int64))
        inputs, labels = chunk[:-1][None], chunk[1:]
        logits = net(inputs, torch.arange(inputs.shape[1])[None], None)[0]
        total += float(F.cross_entropy(logits.double(), labels, reduction="sum"))
        count += len(labels)
    return total / count, count


def test_the_best_checkpoint_has_the_lowest_validation_loss_of_those_saved(run):
    workdir, _ = run
    saved = {
        p.name: json.loads((p / "state.json").read_text())["val_loss"]
        for p in sorted((workdir / "checkpoints").glob("iter_*"))
    }
    assert len(saved) == 2 and all(v is not None for v in saved.values()), saved
    best = json.loads((workdir / "checkpoints" / "best.json").read_text())["name"]
    assert saved[best] == min(saved.values())
    evaluation = _evaluation(workdir)
    assert Path(evaluation["checkpoint"]).name == best
    rows = {r["checkpoint"]: r for r in evaluation["checkpoints"]}
    assert {name: r["val_loss"] for name, r in rows.items()} == saved
    assert rows[best]["test_loss"] == evaluation["test_loss"]
    report = (workdir / "report.md").read_text()
    for r in evaluation["checkpoints"]:
        assert f"| {r['test_loss']:.4f} | {r['test_ppl']:.2f} |" in report
    assert (workdir / "eval" / "checkpoints.png").read_bytes()[:4] == b"\x89PNG"


def test_test_perplexity_recomputed_from_the_test_documents_matches_the_report(run, fresh_model):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    workdir, _ = run
    cfg, net, sp = fresh_model
    manifest = datasets.load_manifest(RunPaths.of(cfg.workdir))
    pieces = []
    for f in manifest["sources"]["corpus"]["files"]["test"]:
        ds = IndexedDataset(str(workdir / f["prefix"]))
        # copies: the arrays of a dataset map its file, unmapped when it is collected
        pieces += [np.array(ds[i]) for i in range(len(ds))]
    loss, count = _mean_loss(net, np.concatenate(pieces), cfg.model.seq_length)
    evaluation = _evaluation(workdir)
    assert count == evaluation["test_tokens"] == manifest["total"]["split_tokens"]["test"] - 1
    assert math.exp(loss) == pytest.approx(evaluation["test_ppl"], rel=1e-4)
    # bits per byte: the summed loss over the UTF-8 bytes of the documents' text, less the
    # first token's (the one token never predicted)
    text = sum(len(sp.decode(p[:-1].tolist()).encode()) for p in pieces)
    text -= len(sp.decode(pieces[0][:1].tolist()).encode())
    bpb = loss * count / (math.log(2) * text)
    assert evaluation["test_bpb"] == pytest.approx(bpb, rel=1e-4)
    assert evaluation["sets"]["test"]["bytes"] == text
    report = (workdir / "report.md").read_text()
    assert f"| test_ppl | {evaluation['test_ppl']} |" in report
    assert f"| test_bpb | {evaluation['test_bpb']} |" in report
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["test_bpb"] == summary["set_bpb"]["test"] == evaluation["test_bpb"]


def test_extra_sets_are_tokenized_with_the_runs_tokenizer_and_reported(run, fresh_model):
    workdir, _ = run
    cfg, net, sp = fresh_model
    documents, text = [], 0
    for line in (workdir.parent / "extra" / "code.jsonl").read_text().splitlines():
        if line not in EXTRA_BAD_LINES:
            documents.append(np.array(sp.encode(json.loads(line)["text"]) + [sp.eos_id()]))
            text += len(json.loads(line)["text"].encode())  # the records as written
    loss, count = _mean_loss(net, np.concatenate(documents), cfg.model.seq_length)
    code = _evaluation(workdir)["sets"]["code"]
    assert code["documents"] == len(documents) and code["tokens"] == count
    assert code["rejected"] == {"malformed_json": 1, "missing_text": 1}
    assert code["ppl"] == pytest.approx(math.exp(loss), rel=1e-4)
    text -= len(sp.decode(documents[0][:1].tolist()).encode())  # never predicted
    assert code["bpb"] == pytest.approx(loss * count / (math.log(2) * text), rel=1e-4)
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["set_ppl"]["code"] == code["ppl"]
    assert summary["set_bpb"]["code"] == code["bpb"]
    report = (workdir / "report.md").read_text()
    figures = f"{code['loss']:.4f} | {code['ppl']:.2f} | {code['bpb']:.4f}"
    row = f"| code | {len(documents)} | {count} | {figures} | 2 |"
    assert row in report


def test_the_report_plots_both_loss_curves_once_per_step(run):
    workdir, _ = run
    assert (workdir / "train" / "loss.png").read_bytes()[:4] == b"\x89PNG"
    assert (workdir / "train" / "throughput.png").read_bytes()[:4] == b"\x89PNG"
    lines = (workdir / "train" / "loss.csv").read_text().splitlines()[1:]
    steps: dict[str, list[int]] = {}
    for line in lines:
        series, step, _, _ = line.split(",")
        steps.setdefault(series, []).append(int(step))
    # the resumed attempt logged steps 15 and 20 again: the plot keeps one point per step
    assert steps == {"train": [5, 10, 15, 20], "validation": [10, 20]}
    report = (workdir / "report.md").read_text()
    assert "![loss curves](train/loss.png)" in report
    assert "train (4 points) and validation (2 points)" in report
    assert '<img src="train/loss.png"' in (workdir / "report.html").read_text()


def test_samples_are_decoded_with_the_runs_tokenizer(run, fresh_model):
    workdir, _ = run
    _, _, sp = fresh_model
    samples = _evaluation(workdir)["samples"]
    report = (workdir / "report.md").read_text()
    assert len(samples) == 3
    for s in samples:
        assert s["greedy_ids"] or s["sampled_ids"]
        for kind in ("greedy", "sampled"):
            assert sp.decode(s[f"{kind}_ids"]) == s[kind]
            assert all(0 <= i < sp.vocab_size() for i in s[f"{kind}_ids"])
        assert f"### {s['prompt']}" in report and s["sampled"] in report


def test_job_accounting_times_every_step_and_counts_the_resume(run):
    workdir, _ = run
    report = (workdir / "report.md").read_text()
    jobs = report.split("## Jobs", 1)[1].split("\n## ", 1)[0]
    timed = [line.split(" | ")[0][2:] for line in jobs.splitlines() if " s | " in line]
    assert timed == ["tokenizer", "tokenize", "verify", "index", "train", "evaluate"]
    assert "| training resumed (requeues, reruns) | 1; from iter_0000010 |" in report
    assert "| GPU hours: total | 0.000 |" in report
    saves = report.split("### Checkpoints", 1)[1].split("\n## ", 1)[0]
    assert "| 20 | " in saves  # what the save cost training, and how long it took
    assert "Resumed (checksums verified, then loaded): from iter_0000010 in " in saves
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["resumes"] == 1 and summary["gpu_hours"] == 0
    assert summary["wall_seconds"] > 0


def test_changing_an_eval_setting_redoes_the_evaluation_only(run, tmp_path):
    workdir, args = run
    copy = tmp_path / "run"
    shutil.copytree(workdir, copy, symlinks=True)
    before = _evaluation(workdir)
    args = [a for a in args if not a.startswith(("workdir=", "eval.all_checkpoints="))]
    args.append("eval.all_checkpoints=false")  # not given, it would keep the run's value
    again = pipeline(f"workdir={copy}", *args)
    assert "already complete: tokenizer, tokenize, verify, index, train" in again.stderr
    assert "evaluate: running" in again.stderr
    after = _evaluation(copy)
    assert "checkpoints" not in after
    assert after["test_loss"] == pytest.approx(before["test_loss"], rel=1e-9)


def sweep(workdir: Path, swept: str) -> dict[str, Path]:
    """Sweep KEY=V1,V2 over the base run's data; each point's folder by its KEY=V."""
    command = [
        "-m",
        "cluster=local",
        f"workdir={workdir}",
        *SMALL_SERIAL,
        "stages=[train,evaluate]",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", *command, swept],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Sweep summary" in result.stdout
    key, values = swept.split("=")
    points = {}
    for marker in (workdir / "sweep").glob("*/sweep_point.json"):
        overrides = json.loads(marker.read_text())["overrides"]
        points.update({o: marker.parent for o in overrides if o in swept_values(key, values)})
    return points


def swept_values(key: str, values: str) -> set[str]:
    return {f"{key}={value}" for value in values.split(",")}


def test_sweeps_on_one_base_keep_each_points_numbers_under_its_own_overrides(run):
    workdir, _ = run
    first = sweep(workdir, "train.lr=0.003,0.001")
    assert sorted(first) == ["train.lr=0.001", "train.lr=0.003"]
    done = {p: (p / "eval" / "DONE.json").stat().st_mtime_ns for p in first.values()}
    again = sweep(workdir, "train.lr=0.003,0.001")  # the same points: found, not redone
    assert again == first
    assert {p: (p / "eval" / "DONE.json").stat().st_mtime_ns for p in first.values()} == done
    second = sweep(workdir, "train.micro_batch_size=2,8")  # other overrides: other folders
    assert sorted(second) == ["train.micro_batch_size=2", "train.micro_batch_size=8"]
    assert not set(first.values()) & set(second.values())
    summary = (workdir / "sweep" / "summary.md").read_text()
    header, _, *rows = summary.split("\n\n")[0].splitlines()
    assert "| best val loss |" in header and header.endswith("| test ppl |")
    assert len(rows) == 4
    for label, folder in {**first, **second}.items():
        s = json.loads((folder / "summary.json").read_text())
        row = next(r for r in rows if r.startswith(f"| {folder.name} |"))
        assert label.split("=")[0] in row and label.split("=")[1] in row, (label, row)
        assert f"| {s['best_val_loss']:.4f} |" in row and row.endswith(f"| {s['test_ppl']:.2f} |")
    # validation reads the same sequences whatever the micro-batch size: the same loss
    losses = [json.loads((p / "summary.json").read_text())["best_val_loss"] for p in (
        first["train.lr=0.003"], second["train.micro_batch_size=2"], second["train.micro_batch_size=8"]
    )]  # fmt: skip
    assert max(losses) - min(losses) < 1e-4 * losses[0], losses
    assert "![validation loss of each point](val_loss.png)" in summary
    assert (workdir / "sweep" / "val_loss.png").read_bytes()[:4] == b"\x89PNG"
