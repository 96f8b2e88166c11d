"""Downstream tasks (eval.harness_tasks) through EleutherAI's lm-evaluation-harness, when the
`lm_eval` package is installed and the tasks' data is already on this machine: nothing is
downloaded at run time (HF_DATASETS_OFFLINE=1, HF_HUB_OFFLINE=1). Otherwise the result says
in one line why the tasks were skipped. lm_eval is not a dependency of the pipeline.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from pipeline.config import PipelineConfig
from pipeline.core import log
from pipeline.evaluation.generate import continuation

_log = log.get()


@torch.no_grad()
def _scores(model, ids: list[int], vocab: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(ids[i] | ids[:i]) for i >= 1, and whether each was the most likely token."""
    tokens = torch.tensor([ids[:-1]], device=device)
    positions = torch.arange(len(ids) - 1, device=device).unsqueeze(0)
    logits = model(tokens, positions, None)[0, :, :vocab].float().log_softmax(-1).cpu()
    target = torch.tensor(ids[1:])
    return logits.gather(1, target[:, None])[:, 0], logits.argmax(-1) == target


def loglikelihood(
    model, sp, context: str, continuation: str, seq_length: int, device
) -> tuple[float, bool]:
    """log p(continuation | context), and whether greedy decoding would produce it; the context
    starts after an end-of-document and is cut from the left to fit the model."""
    tail = sp.encode(continuation)
    if not tail:
        return 0.0, True
    ids = ([sp.eos_id()] + sp.encode(context) + tail)[-(seq_length + 1) :]
    logprobs, greedy = _scores(model, ids, sp.vocab_size(), device)
    return float(logprobs[-len(tail) :].sum()), bool(greedy[-len(tail) :].all())


def rolling_loglikelihood(model, sp, text: str, seq_length: int, device) -> float:
    """log p(text) over windows of seq_length predictions, each token predicted once."""
    ids = [sp.eos_id()] + sp.encode(text)
    return sum(
        float(_scores(model, ids[k : k + seq_length + 1], sp.vocab_size(), device)[0].sum())
        for k in range(0, len(ids) - 1, seq_length)
    )


def _generate_until(model, sp, context: str, options: dict, seq_length: int, device) -> str:
    ids = continuation(model, sp, context, options.get("max_gen_toks", 256), seq_length, device)
    text = sp.decode(ids)
    for stop in options.get("until", []):
        text = text.split(stop)[0]
    return text


def _lm(model, sp, seq_length: int, device):
    from lm_eval.api.model import LM

    class PipelineLM(LM):
        def loglikelihood(self, requests):
            return [loglikelihood(model, sp, *r.args, seq_length, device) for r in requests]

        def loglikelihood_rolling(self, requests):
            return [
                rolling_loglikelihood(model, sp, r.args[0], seq_length, device) for r in requests
            ]

        def generate_until(self, requests):
            return [_generate_until(model, sp, *r.args, seq_length, device) for r in requests]

    return PipelineLM()


def _skipped(tasks: list[str], why: str) -> dict:
    line = f"lm-evaluation-harness skipped ({', '.join(tasks)}): {why}"
    _log.info(line)
    return {"tasks": tasks, "skipped": line}


def run(cfg: PipelineConfig, model: torch.nn.Module, sp, device: torch.device) -> dict:
    """Scores of eval.harness_tasks, or why they were skipped; {} when none are configured."""
    tasks = list(cfg.eval.harness_tasks)
    if not tasks:
        return {}
    if importlib.util.find_spec("lm_eval") is None:
        return _skipped(tasks, "the lm_eval package is not installed")
    os.environ.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")  # before datasets is imported
    try:
        import lm_eval

        out = lm_eval.simple_evaluate(
            model=_lm(model, sp, cfg.model.seq_length, device), tasks=tasks
        )
    except Exception as e:  # most often the task data is not on this machine
        first = (str(e).strip().splitlines() or [""])[0]
        return _skipped(tasks, f"{type(e).__name__}: {first} (task data must be available offline)")
    results = {
        task: {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        for task, metrics in out["results"].items()
    }
    return {"tasks": tasks, "results": results}
