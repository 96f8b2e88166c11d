"""What evaluation measures its loss on: documents in order, as one token stream cut into
windows, every token after the first predicted exactly once.

The test split is each shard's test documents (the bounds megatron-core's split gives them,
`splits.split_bounds`), shard after shard; an extra set is a JSONL file tokenized at evaluation
time with the run's tokenizer, with the bad-record handling of the tokenize stage. Window k
holds stream tokens [k*s, k*s + s + 1) for s = model.seq_length: inputs and their next-token
labels, as GPTDataset cuts sequences but unshuffled and keeping the short last window
(padded, its padding masked out). Anyone can recompute the loss from the documents alone.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from pipeline.config import PipelineConfig
from pipeline.core.paths import RunPaths
from pipeline.data.records import Span
from pipeline.data.splits import split_bounds
from pipeline.data.tokenize import tokenize_spans


@dataclass
class EvalSet:
    name: str
    windows: Windows
    documents: int
    rejected: dict[str, int] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)


class Windows(torch.utils.data.Dataset):
    """Sequences `first..end` of megatron-core IndexedDatasets, laid end to end, as windows of
    seq_length inputs; the length is padded to a multiple of `multiple` with fully masked
    windows, so that every data-parallel rank runs whole micro-batches and no token is lost."""

    def __init__(self, parts: list[tuple], seq_length: int, pad_id: int, multiple: int = 1):
        self.parts = parts  # (IndexedDataset, first sequence, end sequence)
        self.seq_length, self.pad = seq_length, pad_id
        lengths = np.concatenate([ds.sequence_lengths[a:b] for ds, a, b in parts])
        self.part_of = np.concatenate([np.full(b - a, i) for i, (_, a, b) in enumerate(parts)])
        self.sequence = np.concatenate([np.arange(a, b) for _, a, b in parts])
        self.ends = np.cumsum(lengths, dtype=np.int64)
        self.tokens = int(self.ends[-1]) if len(self.ends) else 0
        self.windows = -(-(self.tokens - 1) // seq_length) if self.tokens > 1 else 0
        self.length = -(-self.windows // multiple) * multiple

    def __len__(self) -> int:
        return self.length

    def _read(self, begin: int, end: int) -> np.ndarray:
        out = []
        i = int(np.searchsorted(self.ends, begin, side="right"))
        while begin < end:
            start = int(self.ends[i - 1]) if i else 0
            take = min(end, int(self.ends[i])) - begin
            ds = self.parts[self.part_of[i]][0]
            out.append(ds.get(int(self.sequence[i]), offset=begin - start, length=take))
            begin += take
            i += 1
        return np.concatenate(out).astype(np.int64)

    def __getitem__(self, k: int) -> dict[str, torch.Tensor]:
        tokens = torch.full((self.seq_length,), self.pad, dtype=torch.long)
        labels = torch.full((self.seq_length,), self.pad, dtype=torch.long)
        loss_mask = torch.zeros(self.seq_length)
        if k < self.windows:
            text = torch.from_numpy(
                self._read(k * self.seq_length, min((k + 1) * self.seq_length + 1, self.tokens))
            )
            n = len(text) - 1
            tokens[:n], labels[:n], loss_mask[:n] = text[:-1], text[1:], 1.0
        return {
            "tokens": tokens,
            "labels": labels,
            "loss_mask": loss_mask,
            "position_ids": torch.arange(self.seq_length),
        }


def _indexed(prefix: str | Path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    return IndexedDataset(str(prefix), mmap=True)


def test_split(cfg: PipelineConfig, manifest: dict, multiple: int) -> EvalSet:
    """Every shard's test documents, in order."""
    root = RunPaths.of(cfg.workdir).root
    parts, documents = [], 0
    for shard in manifest["shards"]:
        ds = _indexed(root / shard["prefix"])
        doc_index = ds.document_indices
        begin, end = split_bounds(len(doc_index) - 1, manifest["split"])[2]
        parts.append((ds, int(doc_index[begin]), int(doc_index[end])))
        documents += end - begin
    windows = Windows(parts, cfg.model.seq_length, manifest["eod_id"], multiple)
    return EvalSet("test", windows, documents)


def set_files(pattern: str) -> list[str]:
    return sorted(
        os.path.abspath(p) for p in glob.glob(os.path.expanduser(pattern)) if os.path.isfile(p)
    )


def extra_set(cfg: PipelineConfig, name: str, sp, multiple: int) -> EvalSet:
    """eval.extra_sets[name], tokenized into eval/sets/NAME.{bin,idx} (rejects beside them)."""
    folder = RunPaths.of(cfg.workdir).eval_sets
    folder.mkdir(parents=True, exist_ok=True)
    found = set_files(cfg.eval.extra_sets[name])
    spans = [Span(p) for p in found]
    rejects = folder / f"{name}.rejects.jsonl"
    threads = cfg.cluster.cpus_per_task
    stats, rejected = tokenize_spans(cfg.data, threads, spans, sp, folder / name, rejects, name)
    ds = _indexed(folder / name)
    windows = Windows([(ds, 0, len(ds))], cfg.model.seq_length, sp.eos_id(), multiple)
    return EvalSet(name, windows, stats["documents"], dict(rejected), found)
