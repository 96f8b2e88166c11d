"""Log-likelihoods and greedy continuations of many token sequences through the megatron-core
model, batched: sequences sorted longest first (as lm-evaluation-harness's Hugging Face backend
orders them), padded on the right, one forward pass per batch. Causal attention makes right
padding harmless without a mask: no position attends to a later one, so the padded tail changes
nothing before it, and its positions are never read. Over data-parallel ranks, rank r runs
batches r, r + world, ... and every rank receives all results. Under tensor parallelism the
ranks of one tensor-parallel group run the same batches, each computing its slice of the
vocabulary's logits, gathered whole before the log-softmax."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

Pair = tuple[list[int], list[int]]  # (context ids, continuation ids)


@dataclass
class Scorer:
    model: torch.nn.Module
    vocab: int  # the tokenizer's pieces: the rows the model pads its vocabulary with never count
    device: torch.device
    batch_size: int
    rank: int = 0  # among the data-parallel ranks
    world: int = 1
    data_group: Any = None  # the data-parallel ranks' process group (None: every rank's)
    tensor_group: Any = None  # the tensor-parallel group the logits are split over, if any

    @torch.no_grad()
    def _logits(self, rows: list[list[int]]) -> torch.Tensor:
        """[rows, longest, padded vocab] logits of right-padded rows."""
        width = max(map(len, rows))
        tokens = torch.zeros(len(rows), width, dtype=torch.long)
        for i, row in enumerate(rows):
            tokens[i, : len(row)] = torch.tensor(row)
        positions = torch.arange(width).repeat(len(rows), 1)
        self.model.eval()
        return self._whole_vocabulary(
            self.model(tokens.to(self.device), positions.to(self.device), None)
        )

    def _whole_vocabulary(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits over the whole padded vocabulary from each tensor-parallel rank's slice of
        it (megatron-core splits the output layer's rows evenly, in rank order)."""
        if self.tensor_group is None or dist.get_world_size(self.tensor_group) == 1:
            return logits
        slices = [torch.empty_like(logits) for _ in range(dist.get_world_size(self.tensor_group))]
        dist.all_gather(slices, logits.contiguous(), group=self.tensor_group)
        return torch.cat(slices, dim=-1)

    def _mine(self, batches: list) -> list:
        return batches[self.rank :: self.world]

    def _gathered(self, found: dict) -> dict:
        if self.world == 1:
            return found
        parts: list = [None] * self.world
        dist.all_gather_object(parts, found, group=self.data_group)
        return {k: v for part in parts for k, v in part.items()}

    def loglikelihoods(self, pairs: list[Pair], max_length: int) -> list[tuple[float, bool]]:
        """log p(continuation | context) of each pair and whether greedy decoding yields the
        continuation; context and continuation are cut from the left to max_length + 1 tokens,
        as the harness cuts them. Pairs whose inputs are equal (context + continuation less its
        last token: answers of one token to one question) share one row of a batch."""
        rows: dict[tuple[int, ...], list[int]] = {}
        for n, (context, continuation) in enumerate(pairs):
            if not context or not continuation or len(continuation) > max_length:
                raise ValueError(f"request {n}: no context, no continuation, or too long")
            rows.setdefault(tuple((context + continuation)[-(max_length + 1) :][:-1]), []).append(n)
        order = sorted(rows, key=lambda row: (-len(row), row))
        batches = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        found = {}
        for batch in self._mine(batches):
            logits = self._logits([list(row) for row in batch])
            for i, row in enumerate(batch):
                for n in rows[row]:
                    target = torch.tensor(pairs[n][1], device=self.device)
                    scores = logits[i, len(row) - len(target) : len(row), : self.vocab]
                    logprobs = scores.float().log_softmax(-1)
                    picked = logprobs.gather(1, target[:, None])[:, 0]
                    greedy = bool((scores.argmax(-1) == target).all())
                    found[n] = (float(picked.sum()), greedy)
        found = self._gathered(found)
        return [found[n] for n in range(len(pairs))]

    def greedy(
        self, contexts: list[list[int]], max_new: int, eos: int, stop: Callable[[list[int]], bool]
    ) -> list[list[int]]:
        """The greedy continuation of each context: at most max_new tokens, ending before
        end-of-document or once `stop(continuation)` holds. Each step runs the whole batch's
        prefixes again (no key-value cache), as pipeline.evaluation.generate does."""
        order = sorted(range(len(contexts)), key=lambda n: (-len(contexts[n]), contexts[n]))
        batches = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        found: dict[int, list[int]] = {}
        for batch in self._mine(batches):
            rows = {n: list(contexts[n]) for n in batch}
            new: dict[int, list[int]] = {n: [] for n in batch}
            going = list(batch)
            for _ in range(max_new):
                if not going:
                    break
                logits = self._logits([rows[n] for n in going])
                still = []
                for i, n in enumerate(going):
                    token = int(logits[i, len(rows[n]) - 1, : self.vocab].argmax())
                    if token == eos:
                        continue
                    rows[n].append(token)
                    new[n].append(token)
                    if not stop(new[n]):
                        still.append(n)
                going = still
            found.update(new)
        found = self._gathered(found)
        return [found[n] for n in range(len(contexts))]
