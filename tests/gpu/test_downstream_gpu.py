"""Downstream scoring on one GPU: a model trained here in bf16, scored batched by the pipeline
(Transformer Engine), equals lm-evaluation-harness's Hugging Face backend on the bf16 export
within bf16 tolerance, and batching answers at least 5x more requests per second than one
request per forward pass."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_config
from tests.gpu.test_gpu_training import GPU_SMALL, pipeline
from tests.integration.test_downstream import (
    TASKS,
    _held_out_documents,
    _model,
    _responses,
    _write_tasks,
)

lm_eval = pytest.importorskip("lm_eval")
LOGLIKELIHOOD_TASKS = TASKS[:2]  # multiple choice and cloze: the requests timed
BATCH = 32


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("downstream_gpu")
    workdir = root / "run"
    settings = ["export.dtype=bf16", f"export.out={root / 'hf'}"]
    pipeline(workdir, "stages=[tokenize,train,export]", *settings)
    (root / "tasks").mkdir()  # eval.task_paths must name a folder; its tasks need the run's text
    cfg = make_config(
        workdir,
        *GPU_SMALL,
        *settings,
        f"eval.task_paths=[{root / 'tasks'}]",
        f"eval.micro_batch_size={BATCH}",
    )
    _write_tasks(root / "tasks", _held_out_documents(cfg), count=200)
    return cfg, root


def _close(x: float, y: float) -> bool:
    return abs(x - y) <= 0.03 * abs(y) + 0.1  # bf16 weights and matmuls, fp32 softmax


def test_batched_bf16_scores_equal_the_hugging_face_backend_and_are_5x_faster(trained):
    from pipeline.evaluation import harness

    cfg, root = trained
    net, sp, _ = _model(cfg)
    device = torch.device("cuda")
    paths = list(cfg.eval.task_paths)
    batched = harness.model(cfg, net, sp, device)
    harness.evaluate(LOGLIKELIHOOD_TASKS, paths, batched)  # warm-up: kernels chosen, loaded
    batched = harness.model(cfg, net, sp, device)
    ours = harness.evaluate(TASKS, paths, batched, log_samples=True)
    single = harness.model(cfg, net, sp, device, batch=1)
    harness.evaluate(LOGLIKELIHOOD_TASKS, paths, single)
    theirs = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={root / 'hf'},dtype=bfloat16,softmax_dtype=float32",
        tasks=TASKS,
        task_manager=harness.task_manager(paths),
        batch_size=BATCH,
        device="cuda",
        log_samples=True,
    )
    for task in TASKS[:3]:
        mine, reference = _responses(ours, task), _responses(theirs, task)
        assert len(mine) == len(reference) > 0
        for doc, (a, b) in enumerate(zip(mine, reference, strict=True)):
            for x, y in zip(a, b, strict=True):
                x, y = x[0], y[0]
                x, y = (x, y) if task == "pipeline_rolling" else (x[0], y[0])
                assert _close(x, y), (task, doc, x, y)
    for task in ("pipeline_choice", "pipeline_cloze"):
        assert ours["results"][task]["acc,none"] == pytest.approx(
            theirs["results"][task]["acc,none"], abs=0.05
        )
    # the batched run's time also covers the rolling and generation tasks: count only the
    # log-likelihood requests of both, timed alike
    timed = harness.model(cfg, net, sp, device)
    harness.evaluate(LOGLIKELIHOOD_TASKS, paths, timed)
    fast = timed.requests / timed.seconds
    slow = single.requests / single.seconds
    print(f"\nrequests/s on the GPU: batched ({BATCH}) {fast:.0f}, one per forward {slow:.0f}")
    assert fast >= 5 * slow, (fast, slow)
