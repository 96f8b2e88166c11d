"""What validation and evaluation measure their loss on: documents in order, as one token
stream cut into windows, every token after the first predicted at most once.

A source's validation or test split is its files of that split (pipeline.data.split_assignment), in
corpus order; an extra set is a JSONL file tokenized at evaluation time with the run's
tokenizer, with the bad-record handling of the tokenize stage. Window k holds stream tokens
[k*s, k*s + s + 1) for s = model.seq_length: inputs and their next-token labels, as GPTDataset
cuts sequences but unshuffled. Evaluation reads every window, keeping the short last one
(padded, its padding masked out); validation reads train.eval_samples whole windows spread
evenly over the stream, the same ones at every validation and whatever the sharding. Anyone
can recompute the loss from the documents alone.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from pipeline.config import PipelineConfig
from pipeline.config.derived import validation_samples
from pipeline.core.paths import RunPaths
from pipeline.data import sources
from pipeline.data.records import Span
from pipeline.data.token_bytes import TokenBytes
from pipeline.data.tokenize import tokenize_spans

BYTES_BLOCK = 1 << 22  # tokens read at once to count their bytes


@dataclass
class EvalSet:
    name: str
    windows: Windows
    documents: int
    rejected: dict[str, int] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)


class Windows(torch.utils.data.Dataset):
    """Sequences `first..end` of megatron-core IndexedDatasets, laid end to end, as windows of
    seq_length inputs: all of them, or `picks` whole windows spread evenly over the stream. The
    length is padded to a multiple of `multiple` with fully masked windows, so that every
    data-parallel rank runs whole micro-batches and no token is lost."""

    def __init__(
        self,
        parts: list[tuple],
        seq_length: int,
        pad_id: int,
        multiple: int = 1,
        picks: int | None = None,
    ):
        self.parts = parts  # (IndexedDataset, first sequence, end sequence)
        self.seq_length, self.pad = seq_length, pad_id
        empty = np.zeros(0, dtype=np.int64)
        lengths = np.concatenate([empty, *(ds.sequence_lengths[a:b] for ds, a, b in parts)])
        self.part_of = np.concatenate(
            [empty, *(np.full(b - a, i) for i, (_, a, b) in enumerate(parts))]
        )
        self.sequence = np.concatenate([empty, *(np.arange(a, b) for _, a, b in parts)])
        self.ends = np.cumsum(lengths, dtype=np.int64)
        self.tokens = int(self.ends[-1]) if len(self.ends) else 0
        if picks is None:
            self.starts = np.arange(0, max(self.tokens - 1, 0), seq_length)
        else:  # whole windows only, evenly spaced: from window 0 to the last whole one
            whole = max(self.tokens - 1, 0) // seq_length
            chosen = min(picks, whole)
            self.starts = (np.arange(chosen) * whole // max(chosen, 1)) * seq_length
        self.windows = len(self.starts)
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

    def text_bytes(self, first: int, end: int, token_bytes: TokenBytes) -> int:
        """UTF-8 bytes of the text that stream tokens [first, end) encode. Evaluation predicts
        the tokens [1, 1 + n) of the stream, n the tokens it counted, as its windows are read
        from the first on (eval.max_batches may stop it early): those, and no others, are
        what its bits per byte divides by."""
        starts = self.ends - np.diff(self.ends, prepend=0)  # of each sequence
        total = 0
        for begin in range(first, end, BYTES_BLOCK):
            stop = min(begin + BYTES_BLOCK, end)
            document_first = np.zeros(stop - begin, dtype=bool)
            inside = starts[(starts >= begin) & (starts < stop)]
            document_first[inside - begin] = True  # each sequence is one document
            total += token_bytes.count(self._read(begin, stop), document_first)
        return total

    def __getitem__(self, k: int) -> dict[str, torch.Tensor]:
        tokens = torch.full((self.seq_length,), self.pad, dtype=torch.long)
        labels = torch.full((self.seq_length,), self.pad, dtype=torch.long)
        loss_mask = torch.zeros(self.seq_length)
        if k < self.windows:
            start = int(self.starts[k])
            text = torch.from_numpy(
                self._read(start, min(start + self.seq_length + 1, self.tokens))
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


def held_out(cfg: PipelineConfig, manifest: dict, split: str, source: str) -> tuple[list, int]:
    """The (IndexedDataset, first, end) parts of one split of one source, in corpus order, and
    how many documents they hold."""
    root = RunPaths.of(cfg.workdir).root
    parts, documents = [], 0
    for f in manifest["sources"][source]["files"][split]:
        ds = _indexed(root / f["prefix"])
        parts.append((ds, 0, len(ds)))
        documents += f["documents"]
    return parts, documents


def set_name(split: str, source: str, manifest: dict) -> str:
    """ "test" for a corpus of one source, "test/web" for source web of a mixture."""
    return split if len(manifest["sources"]) == 1 else f"{split}/{source}"


def test_sets(cfg: PipelineConfig, manifest: dict, multiple: int) -> list[EvalSet]:
    """Each source's test split, every window."""
    found = []
    for source in manifest["sources"]:
        parts, documents = held_out(cfg, manifest, "test", source)
        windows = Windows(parts, cfg.model.seq_length, manifest["eod_id"], multiple)
        found.append(EvalSet(set_name("test", source, manifest), windows, documents))
    return found


def validation_sets(cfg: PipelineConfig, manifest: dict, multiple: int) -> dict[str, Windows]:
    """Each source's validation windows, by source name: train.eval_samples of them (or as
    many whole windows as its split holds)."""
    found = {}
    for source in manifest["sources"]:
        parts, _ = held_out(cfg, manifest, "validation", source)
        found[source] = Windows(
            parts, cfg.model.seq_length, manifest["eod_id"], multiple, validation_samples(cfg)
        )
    return found


def mixture_loss(losses: dict[str, float], cfg: PipelineConfig) -> float:
    """The loss of the training mixture: each source's loss weighted by its sampling weight."""
    weights = sources.weights(cfg.data)
    return sum(weights[name] * loss for name, loss in losses.items())


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
