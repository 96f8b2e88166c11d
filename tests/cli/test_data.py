"""The data stage as a user drives it: a mixture of two sources trained, validated and reported
per source, the plan's shares and epochs, each source's perplexity that of the exported model,
a source changed on a rerun judged as a change; a split too small for training refused in one line
before any training while a tokenize-only run goes through; a run folder tokenized by 0.2
refused in one line, and tokenized again with force=tokenize."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.paths import RunPaths
from tests.conftest import ROOT, SMALL_SERIAL, cli, module

OLD_RUN = Path(__file__).parent / "run_of_0.2"  # plan, markers, manifest and runs.jsonl of 0.2


def write_sources(folder: Path) -> tuple[Path, Path]:
    """Two sources of real text with different keys: Python's help topics as prose, and the
    standard library's docstrings as code-like text."""
    from pipeline.data import corpus

    texts = list(corpus.documents())
    random.Random(5).shuffle(texts)
    folder.mkdir(parents=True, exist_ok=True)
    prose, code = folder / "prose.jsonl", folder / "code.jsonl"
    prose.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:300]))
    code.write_text("".join(json.dumps({"content": t}) + "\n" for t in texts[300:420]))
    return prose, code


@pytest.fixture(scope="module")
def mixture(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A mixture of two sources with a vocabulary megatron-core pads (1000 pieces, 1024 rows),
    trained, evaluated and exported in fp32."""
    tmp_path = tmp_path_factory.mktemp("mixture")
    prose, code = write_sources(tmp_path / "corpus")
    workdir = tmp_path / "run"
    result = cli(
        f"workdir={workdir}",
        *SMALL_SERIAL,
        "tokenizer.vocab_size=1000",
        "data.num_shards=3",
        f"+data.sources.prose={{inputs:[{prose}],weight:3}}",
        f"+data.sources.code={{inputs:[{code}],text_key:content,weight:1}}",
        "data.warn_epochs=0.2",
        "stages=[tokenize,train,evaluate,export]",
        "export.dtype=fp32",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir, result


def test_a_mixture_trains_by_weight_and_reports_every_source(mixture):
    workdir, result = mixture
    lines = result.stderr.splitlines()
    share = [line for line in lines if line.startswith("[plan]   ")]
    # the plan before submitting (estimated), then the index step's (from the tokenized data)
    assert any(line.startswith("[plan]   code: 25.0% of samples, ~") for line in share)
    assert any(line.startswith("[plan]   prose: 75.0% of samples, ~") for line in share)
    manifest = json.loads(RunPaths.of(workdir).manifest.read_text())
    code_tokens = manifest["sources"]["code"]["split_tokens"]["train"]
    budget = 20 * 8 * 64  # train.steps x global batch x sequence
    epochs = budget * 0.25 / code_tokens
    assert (
        f"[plan]   code: 25.0% of samples, {code_tokens:,} training tokens, {epochs:.2f} epochs"
        in (lines)
    )
    assert any(
        line.startswith("[plan] warning: source code is read") and "data.warn_epochs=0.2" in line
        for line in lines
    ) == (epochs > 0.2)
    described = manifest["sources"]
    assert set(described) == {"code", "prose"}
    assert described["prose"]["documents"] + described["prose"]["no_token_documents"] == 300
    assert described["code"]["documents"] + described["code"]["no_token_documents"] == 120
    metrics = [json.loads(line) for line in (workdir / "train" / "metrics.jsonl").open()]
    validations = [r for r in metrics if "val_loss" in r]
    assert validations
    for r in validations:  # the mixture's loss is the sources' weighted by their shares
        mixed = 0.75 * r["val_loss/prose"] + 0.25 * r["val_loss/code"]
        assert abs(r["val_loss"] - mixed) < 1e-9
    evaluation = json.loads(RunPaths.of(workdir).eval_done.read_text())
    sets = evaluation["sets"]
    assert list(sets)[:3] == ["test", "test/code", "test/prose"]
    mixed = 0.75 * sets["test/prose"]["loss"] + 0.25 * sets["test/code"]["loss"]
    assert abs(sets["test"]["loss"] - mixed) < 1e-9 and evaluation["test_loss"] == mixed
    assert sets["test"]["tokens"] == sets["test/code"]["tokens"] + sets["test/prose"]["tokens"]
    report = (workdir / "report.md").read_text()
    assert "| code | 25.0% | " in report and "| prose | 75.0% | " in report
    assert "| test/code | " in report and "| test/prose | " in report
    assert "validation/code" in (workdir / "train" / "loss.csv").read_text()


def test_the_perplexities_reported_are_those_of_the_exported_model_over_its_real_vocabulary(
    mixture,
):
    """megatron-core pads 1000 pieces to 1024 rows; the padding gets no probability, so each
    source's test perplexity and the mixture's are the exported fp32 model's in transformers,
    to float precision (the tool's default tolerance for an fp32 export is 1e-5; it was 0.1%
    to 0.7% off while the padding took part in the softmax)."""
    workdir, _ = mixture
    result = subprocess.run(
        [sys.executable, "tools/hf_perplexity.py", f"--workdir={workdir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    measured = json.loads(result.stdout)
    assert measured["dtype"] == "fp32" and measured["tolerance"] == 1e-5
    assert measured["device"] == "cpu"  # auto, on a machine without a GPU
    assert set(measured["sets"]) == {"test", "test/code", "test/prose"}
    for name, one in measured["sets"].items():
        assert one["transformers_tokens"] == one["pipeline_tokens"] > 0, name
        assert abs(one["ppl_relative_difference"]) <= 1e-5, (name, one)


@pytest.mark.parametrize(
    "change",
    ["data.sources.code.weight=2", "~data.sources.code", "data.sources.prose.text_key=body"],
)
def test_a_mixture_runs_sources_are_settings_of_a_rerun_without_naming_the_mixture_again(
    mixture, change
):
    """The run's +data.sources... overrides are replayed under the command line's, so a
    change to a source is judged as a change (refused here, in one line: the data or the
    weights it was trained on), never 'not a setting of this pipeline'."""
    workdir, _ = mixture
    before = (workdir / "runs.jsonl").read_text()
    refused = cli(f"workdir={workdir}", change)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.count("\n") == 1 and "not a setting" not in refused.stderr
    assert refused.stderr.startswith("error: ") and "data.sources" in refused.stderr
    assert (workdir / "runs.jsonl").read_text() == before
    status = module("pipeline.status", f"workdir={workdir}", change, timeout=120)
    said = status.stdout + status.stderr
    assert status.returncode in (1, 2) and "not a setting" not in said, said
    assert "REFUSED" in status.stdout or status.stderr == refused.stderr, said


def test_a_split_too_small_to_train_is_refused_before_training_not_when_tokenizing(
    tmp_path, tokenized
):
    few = tmp_path / "few.jsonl"
    rng = random.Random(1)
    few.write_text(
        "".join(
            json.dumps({"text": f"Note {i}: " + "word " * rng.randint(3, 9)}) + "\n"
            for i in range(40)
        )
    )
    workdir = tmp_path / "run"
    model = RunPaths.of(tokenized.workdir).tokenizer_model  # 40 notes are too few to train one
    common = [
        f"workdir={workdir}",
        *SMALL_SERIAL,
        f"data.inputs=[{few}]",
        "data.split='90,2,8'",
        f"tokenizer.model={model}",
    ]
    tokenized = cli(*common, "stages=[tokenize]")
    assert tokenized.returncode == 0, tokenized.stderr[-3000:]
    manifest = json.loads(RunPaths.of(workdir).manifest.read_text())
    validation = manifest["total"]["split_tokens"]["validation"]
    assert validation < 65  # what this test is about: less than one sequence of 64 + 1
    refused = cli(*common)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr == (
        f"error: data.split: the validation split has {validation} tokens, fewer than one "
        "sequence of model.seq_length+1=65; give validation a larger share of "
        "data.split='90,2,8' and tokenize again (force=tokenize: each document's split is "
        "decided when it is tokenized), or give more data\n"
    )
    assert not (workdir / "index-cache").exists() and not (workdir / "train").exists()
    # as advised: the change is judged as a change of the tokenized data, not sized by the old
    resplit = cli(*common[:-2], "data.split='70,20,10'", common[-1])
    assert resplit.returncode == 2 and resplit.stderr.count("\n") == 1, resplit.stderr
    assert resplit.stderr.startswith("error: tokenize: ") and "force=tokenize" in resplit.stderr
    assert "data.split=90,2,8 (now 70,20,10)" in resplit.stderr


def old_run(tmp_path: Path) -> Path:
    workdir = tmp_path / "old"
    shutil.copytree(OLD_RUN, workdir)
    return workdir


def test_a_run_folder_tokenized_by_0_2_is_refused_in_one_line_and_tokenized_again(tmp_path):
    workdir = old_run(tmp_path)
    before = sorted(p.name for p in (workdir / "data").iterdir())
    expected = (
        f"error: data: {workdir / 'data'} was tokenized by an earlier version, whose held-out "
        "split depended on data.num_shards; tokenize it again (force=tokenize in that run "
        "moves it to replaced/) or use a new workdir\n"
    )
    for stages in ("stages=[tokenize]", "stages=[train,evaluate]", "stages=[tokenize,train]"):
        refused = cli(f"workdir={workdir}", stages)
        assert refused.returncode == 2 and refused.stderr == expected, refused.stderr
    other = cli(f"workdir={tmp_path / 'other'}", f"data.prepared={workdir}", "stages=[train]")
    assert other.returncode == 2 and other.stderr == expected, other.stderr
    assert sorted(p.name for p in (workdir / "data").iterdir()) == before
    again = cli(f"workdir={workdir}", "stages=[tokenize]", "force=tokenize")
    assert again.returncode == 0, again.stderr[-3000:]
    manifest = json.loads(RunPaths.of(workdir).manifest.read_text())
    assert manifest["format"] == 2 and manifest["total"]["documents"] > 0
    [moved] = (workdir / "replaced").iterdir()
    assert sorted(p.name for p in (moved / "data").iterdir()) == before
