"""Batched scoring (pipeline.evaluation.scoring) gives each request what it gets alone: padding
on the right changes nothing before it, the model's padded vocabulary rows never count, greedy
continuations stop where they should, and over two data-parallel ranks (gloo processes) every
rank receives every result, equal to one rank's."""

from __future__ import annotations

import json
import os
import random
import time

import pytest
import torch
import torch.multiprocessing as mp

from pipeline.evaluation.scoring import Scorer

VOCAB, PADDED = 40, 48


class CausalToy(torch.nn.Module):
    """A language model with megatron-core's call signature whose logits at a position depend
    on the tokens up to it alone; its padded vocabulary rows are made the likeliest, so that
    counting them would show."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(PADDED, 16)
        self.position = torch.nn.Embedding(64, 16)
        self.out = torch.nn.Linear(16, PADDED)
        with torch.no_grad():
            self.out.bias[VOCAB:] = 10.0

    def forward(self, tokens, positions, mask):
        running = self.embed(tokens).cumsum(1) / (positions[..., None] + 1)
        return self.out(torch.tanh(running + self.position(positions)))


def _requests(count: int = 23, seed: int = 1) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        context = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 30))]
        pairs.append((context, [rng.randrange(VOCAB) for _ in range(rng.randint(1, 6))]))
    pairs.append((pairs[0][0], pairs[0][1][:-1] + [(pairs[0][1][-1] + 1) % VOCAB]))  # shares
    return pairs


@torch.no_grad()
def _alone(model, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    ids = torch.tensor([(context + continuation)[:-1]])
    logits = model(ids, torch.arange(ids.shape[1])[None], None)[0, -len(continuation) :, :VOCAB]
    target = torch.tensor(continuation)
    logprob = logits.log_softmax(-1).gather(1, target[:, None]).sum()
    return float(logprob), bool((logits.argmax(-1) == target).all())


def test_a_batch_scores_each_request_as_it_scores_alone():
    model = CausalToy()
    pairs = _requests()
    batched = Scorer(model, VOCAB, torch.device("cpu"), batch_size=5).loglikelihoods(pairs, 63)
    for (context, continuation), (logprob, greedy) in zip(pairs, batched, strict=True):
        alone = _alone(model, context, continuation)
        assert logprob == pytest.approx(alone[0], abs=1e-5) and greedy == alone[1]
    with pytest.raises(ValueError, match="request 0"):
        Scorer(model, VOCAB, torch.device("cpu"), 4).loglikelihoods([([], [1])], 63)


def test_greedy_continuations_batched_equal_one_at_a_time_and_stop():
    model = CausalToy()
    contexts = [c for c, _ in _requests()]
    scorer = Scorer(model, VOCAB, torch.device("cpu"), batch_size=6)

    def stop(ids: list[int]) -> bool:
        return ids.count(2) == 2

    batched = scorer.greedy(contexts, 8, eos=VOCAB - 1, stop=stop)
    one = Scorer(model, VOCAB, torch.device("cpu"), batch_size=1)
    assert batched == one.greedy(contexts, 8, eos=VOCAB - 1, stop=stop)
    for ids in batched:
        assert len(ids) <= 8 and VOCAB - 1 not in ids and ids[:-1].count(2) < 2
        assert all(t < VOCAB for t in ids)
    assert [] in batched  # end-of-document first
    assert any(len(ids) < 8 and ids.count(2) == 2 for ids in batched)  # stopped


def _rank(rank: int, port: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    scorer = Scorer(CausalToy(), VOCAB, torch.device("cpu"), 3, rank=rank, world=2)
    pairs = _requests()
    out = {
        "loglikelihoods": scorer.loglikelihoods(pairs, 63),
        "greedy": scorer.greedy([c for c, _ in pairs], 5, VOCAB - 1, lambda ids: False),
    }
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    torch.distributed.destroy_process_group()


def test_two_data_parallel_ranks_each_get_every_result(tmp_path):
    port = 29500 + os.getpid() % 1000
    mp.start_processes(_rank, args=(port, str(tmp_path)), nprocs=2, start_method="spawn")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1]
    alone = Scorer(CausalToy(), VOCAB, torch.device("cpu"), 3)
    pairs = _requests()
    expected = alone.loglikelihoods(pairs, 63)
    for (a, ga), (b, gb) in zip(ranks[0]["loglikelihoods"], expected, strict=True):
        assert a == pytest.approx(b, abs=1e-5) and ga == gb
    assert ranks[0]["greedy"] == alone.greedy([c for c, _ in pairs], 5, VOCAB - 1, lambda i: False)


def _slow(x: int) -> int:
    time.sleep(0.5)
    return x


def _pool_ended_with_busy_workers() -> int:
    """As the harness computes a metric's stderr, in a job's process: a pool of forked workers,
    ended (SIGTERM) while workers are still alive; here they are busy, so they always are."""
    import multiprocessing

    from pipeline.evaluation import harness

    harness.pool_workers_end_on_sigterm()
    with multiprocessing.get_context("fork").Pool(2) as pool:
        return next(pool.imap(_slow, range(8)))


def test_a_pool_in_a_submitit_job_ends_although_the_job_ignores_sigterm(tmp_path):
    """submitit's job handler ignores SIGTERM, and forked workers inherit it: without the hook
    a worker alive when the pool ends never does, and the pool waits for it forever (the
    downstream jobs of several ranks that never finished)."""
    import submitit

    executor = submitit.LocalExecutor(folder=str(tmp_path))
    executor.update_parameters(timeout_min=2)
    job = executor.submit(_pool_ended_with_busy_workers)
    deadline = time.monotonic() + 60
    while not job.done() and time.monotonic() < deadline:
        time.sleep(0.5)
    finished = job.done()
    if not finished:
        job.cancel()
    assert finished and job.result() == 0
