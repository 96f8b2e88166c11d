"""What the plan reads of the data, read once when it is made: the vocabulary and where it was
read, and each source's training tokens (counted in the tokenized data, else estimated). The
plan hands it to the preflight checks and to the printed plan."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config import PipelineConfig
from pipeline.data import datasets, mixture


@dataclass(frozen=True)
class DataSummary:
    vocab_size: int
    vocab_source: str  # what the vocabulary was read from
    # each source's training tokens and how they were estimated (None: counted); None where
    # an input went away (the launch refuses it with its own line)
    train_tokens: tuple[dict[str, int], str | None] | None


def summarize(cfg: PipelineConfig, vocab: tuple[int, str] | None = None) -> DataSummary:
    """The summary of the run's data; `vocab`: the vocabulary size and where it came from,
    when the caller has it (else read as the run would)."""
    vocab_size, source = vocab or datasets.vocab_size(cfg)
    return DataSummary(vocab_size, source, mixture.known_train_tokens(cfg))
