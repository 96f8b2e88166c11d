"""Downstream tasks scored by the pipeline equal lm-evaluation-harness's own Hugging Face backend
on the exported model: tasks defined here on the run's held-out text (multiple choice, cloze,
rolling log-likelihood, greedy generation), compared request by request in fp32 on the CPU;
batching changes no number; a checkpoint's record; the tasks that lack data offline."""

from __future__ import annotations

import json
import shutil
import textwrap
import time
from pathlib import Path

import pytest
import torch

from pipeline.core import files
from pipeline.core.errors import ConfigError
from pipeline.core.paths import RunPaths
from pipeline.data import evalsets
from pipeline.data.datasets import load_manifest
from pipeline.data.tokenizer import load
from tests.conftest import SMALL_SERIAL, changed, make_config

lm_eval = pytest.importorskip("lm_eval")
pytest.importorskip("transformers")

TASKS = ["pipeline_choice", "pipeline_cloze", "pipeline_rolling", "pipeline_generate"]
TOLERANCE = 1e-4  # nats, per request (fp32)


def _held_out_documents(cfg) -> list[str]:
    """The run's test split, decoded: text the model never trained on."""
    manifest = load_manifest(RunPaths.of(cfg.workdir))
    sp = load(manifest["tokenizer"])
    source = next(iter(manifest["sources"]))
    parts, _ = evalsets.held_out(cfg, manifest, "test", source)
    docs = []
    for ds, first, end in parts:
        for i in range(first, end):
            ids = [int(t) for t in ds[i] if int(t) != sp.eos_id()]
            docs.append(sp.decode(ids))
    return [d for d in docs if len(d.split(" ")) > 40]


def _task(folder: Path, name: str, rows: list[dict], spec: str) -> None:
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    head = f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
    head += f"    test: {data}\ntest_split: test\n"
    (folder / f"{name}.yaml").write_text(head + textwrap.dedent(spec))


def _write_tasks(folder: Path, docs: list[str], count: int = 12) -> None:
    """Four tasks on held-out documents, each request built from one of `count` of them."""
    words = [d.split(" ") for d in docs][:count]
    n = len(words)
    choice = [
        {
            "context": " ".join(w[:12]),
            "choices": [" ".join(words[(i + k) % n][12:18]) for k in range(3)][::-1]
            if i % 2
            else [" ".join(words[(i + k) % n][12:18]) for k in range(3)],
            "gold": 2 if i % 2 else 0,
        }
        for i, w in enumerate(words)
    ]
    cloze = [{"context": " ".join(w[:15]), "continuation": " ".join(w[15:17])} for w in words]
    rolling = [{"text": d[:1200]} for d in docs[:6]]
    generate = [{"context": " ".join(w[:10]), "continuation": w[10]} for w in words[:8]]
    _task(
        folder,
        "pipeline_choice",
        choice,
        """\
        output_type: multiple_choice
        doc_to_text: "{{context}}"
        doc_to_choice: choices
        doc_to_target: gold
        metric_list:
          - metric: acc
          - metric: acc_norm
        """,
    )
    _task(
        folder,
        "pipeline_cloze",
        cloze,
        """\
        output_type: loglikelihood
        doc_to_text: "{{context}}"
        doc_to_target: "{{continuation}}"
        metric_list:
          - metric: perplexity
          - metric: acc
        """,
    )
    _task(
        folder,
        "pipeline_rolling",
        rolling,
        """\
        output_type: loglikelihood_rolling
        doc_to_text: ""
        doc_to_target: "{{text}}"
        metric_list:
          - metric: word_perplexity
          - metric: byte_perplexity
          - metric: bits_per_byte
        """,
    )
    _task(
        folder,
        "pipeline_generate",
        generate,
        """\
        output_type: generate_until
        doc_to_text: "{{context}}"
        doc_to_target: "{{continuation}}"
        generation_kwargs:
          until: [" "]
          max_gen_toks: 6
          do_sample: false
        metric_list:
          - metric: exact_match
        """,
    )


@pytest.fixture(scope="module")
def setting(finished_run, tmp_path_factory):
    """A copy of the finished run with the four tasks and an fp32 export; the Hugging Face
    libraries kept offline and their cache inside the test's folder."""
    root = tmp_path_factory.mktemp("downstream")
    workdir = root / "run"
    shutil.copytree(finished_run.workdir, workdir, symlinks=True)
    (root / "tasks").mkdir()  # eval.task_paths must name a folder; its tasks come below
    cfg = make_config(
        workdir,
        *SMALL_SERIAL,
        "export.dtype=fp32",
        f"export.out={root / 'hf'}",
        f"eval.harness_tasks=[{','.join(TASKS)}]",
        f"eval.task_paths=[{root / 'tasks'}]",
        "eval.micro_batch_size=8",
    )
    _write_tasks(root / "tasks", _held_out_documents(cfg))
    from pipeline.exporting.steps import EXPORT

    EXPORT.run(cfg)
    with pytest.MonkeyPatch.context() as env:
        for name, value in {
            "HF_DATASETS_CACHE": str(root / "cache" / "datasets"),
            "HF_HUB_CACHE": str(root / "cache" / "hub"),
            "HF_DATASETS_OFFLINE": "1",
            "HF_HUB_OFFLINE": "1",
        }.items():
            env.setenv(name, value)
        yield cfg, root


def _model(cfg):
    """The run's best checkpoint in a megatron-core model, as a downstream job loads it."""
    from pipeline.evaluation.evaluate import single_device
    from pipeline.training import checkpoint
    from pipeline.training.engine import Engine

    paths = RunPaths.of(cfg.workdir)
    manifest = files.read_json(paths.manifest)
    folder = checkpoint.verified(paths.checkpoints, "best")
    layout = files.read_json(folder / "state.json")["layout"]
    engine = Engine(single_device(cfg), manifest["vocab_size"], layout["padded_vocab_size"])
    checkpoint.load(folder, engine.backend, engine.chunks, None)
    return engine.chunks[0].eval(), load(manifest["tokenizer"]), folder


@pytest.fixture(scope="module")
def ours(setting):
    from pipeline.evaluation import harness

    cfg, _ = setting
    net, sp, _ = _model(cfg)
    lm = harness.model(cfg, net, sp, torch.device("cpu"))
    out = harness.evaluate(TASKS, list(cfg.eval.task_paths), lm, log_samples=True)
    return out, lm


@pytest.fixture(scope="module")
def theirs(setting):
    from pipeline.evaluation import harness

    cfg, root = setting
    return lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={root / 'hf'},dtype=float32",
        tasks=TASKS,
        task_manager=harness.task_manager(list(cfg.eval.task_paths)),
        batch_size=4,
        device="cpu",
        log_samples=True,
    )


def _responses(out: dict, task: str) -> list:
    return [s["resps"] for s in sorted(out["samples"][task], key=lambda s: s["doc_id"])]


@pytest.mark.parametrize("task", TASKS)
def test_each_request_scores_as_the_harness_hugging_face_backend_scores_it(task, ours, theirs):
    mine, reference = _responses(ours[0], task), _responses(theirs, task)
    assert len(mine) == len(reference) > 0
    if task == "pipeline_generate":  # the model continues the text, not with nothing
        assert any(r[0] for r in mine)
    for doc, (a, b) in enumerate(zip(mine, reference, strict=True)):
        for x, y in zip(a, b, strict=True):
            x, y = x[0], y[0]
            if task == "pipeline_generate":
                assert x == y, (doc, x, y)
            elif task == "pipeline_rolling":
                assert x == pytest.approx(y, abs=TOLERANCE), doc
            else:  # (log-likelihood, greedy)
                assert x[0] == pytest.approx(y[0], abs=TOLERANCE), doc
                assert x[1] == y[1], doc
    for metric, value in theirs["results"][task].items():
        if isinstance(value, float) and "stderr" not in metric:
            assert ours[0]["results"][task][metric] == pytest.approx(value, rel=1e-4), metric


def test_batching_changes_no_number_and_its_speed_is_reported(setting, ours):
    from pipeline.evaluation import harness

    cfg, _ = setting
    batched = ours[1]
    net, sp, _ = _model(cfg)
    single = harness.model(cfg, net, sp, torch.device("cpu"), batch=1)
    started = time.perf_counter()
    out = harness.evaluate(TASKS[:3], list(cfg.eval.task_paths), single, log_samples=True)
    assert time.perf_counter() - started > single.seconds > 0
    for task in TASKS[:3]:
        for a, b in zip(_responses(out, task), _responses(ours[0], task), strict=True):
            assert json.dumps(a) == json.dumps(b) or a == pytest.approx(b, abs=1e-5)
    print(
        f"\nrequests/s on the CPU: batched ({batched.scorer.batch_size}) "
        f"{batched.requests / batched.seconds:.1f}, one per forward "
        f"{single.requests / single.seconds:.1f}"
    )


def test_a_checkpoint_is_scored_into_one_record(setting, ours, tmp_path):
    from pipeline.evaluation.downstream import score_checkpoint

    cfg, _ = setting
    _, _, folder = _model(cfg)
    out = tmp_path / "eval" / f"{folder.name}.json"
    record = score_checkpoint(cfg, folder, out)
    assert files.read_json(out) == json.loads(json.dumps(record))
    state = files.read_json(folder / "state.json")
    assert record["checkpoint"] == folder.name
    assert record["step"] == state["step"] and record["tokens"] == state["run"]["tokens"] > 0
    assert set(record["tasks"]) == set(TASKS)
    assert record["tasks"]["pipeline_choice"]["acc,none"] == pytest.approx(
        ours[0]["results"]["pipeline_choice"]["acc,none"]
    )
    assert record["requests"] > 0 and record["requests_per_s"] > 0


def test_task_data_is_fetched_into_the_cache_that_jobs_read(setting, tmp_path):
    from pipeline.evaluation.downstream import fetch_task_data, missing_task_data

    cfg, _ = setting
    asked = changed(cfg, "eval", harness_tasks=["pipeline_cloze"], cache_dir=str(tmp_path))
    assert fetch_task_data(asked, tmp_path) == []
    assert any((tmp_path / "datasets").rglob("*.arrow"))  # prepared there, read offline
    assert missing_task_data(asked) == []


def test_tasks_without_data_offline_are_named_before_any_job(setting, tmp_path):
    from pipeline.evaluation.downstream import missing_task_data

    cfg, root = setting
    remote = root / "tasks" / "pipeline_remote.yaml"
    remote.write_text(
        "task: pipeline_remote\ndataset_path: no-such-owner/no-such-data\ntest_split: test\n"
        "output_type: loglikelihood\ndoc_to_text: '{{a}}'\ndoc_to_target: '{{b}}'\n"
    )
    try:
        asked = changed(
            cfg,
            "eval",
            harness_tasks=["pipeline_cloze", "pipeline_remote"],
            cache_dir=str(tmp_path / "cache"),
        )
        assert missing_task_data(asked) == ["pipeline_remote"]
        with pytest.raises(ConfigError, match=r"^eval.harness_tasks: unknown task\(s\) nonesuch"):
            missing_task_data(changed(cfg, "eval", harness_tasks=["nonesuch"]))
    finally:
        remote.unlink()
