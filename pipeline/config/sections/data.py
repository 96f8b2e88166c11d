"""The data sections: what a run reads (data.*, one source of a mixture) and the tokenizer
it is read with (tokenizer.*)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from pipeline.config import choices as c
from pipeline.config import rules as r
from pipeline.config.keys import NOT_SETTING, OUTPUT, key
from pipeline.config.rules import AT_LEAST_ONE, NOT_EMPTY, POSITIVE


@dataclass
class SourceConfig:
    """One source of a data mixture (data.sources.NAME)."""

    # globs of JSONL (plain, gzip, zstd), Parquet, Arrow files or datasets.save_to_disk folders
    inputs: list[str] = key(role=OUTPUT, help="globs of its files", factory=list)
    text_key: str | None = key(None, OUTPUT, "none: data.text_key", rule=NOT_EMPTY)
    weight: float = key(
        1.0, OUTPUT, "its share of the training samples, relative to the others", rule=POSITIVE
    )
    format: str | None = key(
        None, OUTPUT, "auto | text (a file a document); none: data.format", rule=r.SOURCE_FORMAT
    )
    where: str | None = key(
        None, OUTPUT, "a Parquet/Arrow row filter; none: all", rule=r.ROW_FILTER
    )


@dataclass
class DataConfig:
    # Each data group sets it, so that one that leaves it ??? is refused, not defaulted
    inputs: list[str] = key(
        MISSING,
        OUTPUT,
        "globs of one source (JSONL plain/gzip/zstd, Parquet, Arrow, datasets folders, text); "
        "empty: the built-in corpus",
        common=True,
    )
    format: c.DataFormat = key(
        c.DataFormat.auto, OUTPUT, "auto: records or rows, by content; text: a file a document"
    )
    where: str | None = key(
        None,
        OUTPUT,
        "a row filter on Parquet/Arrow columns, e.g. 'language_score >= 0.9'",
        rule=r.ROW_FILTER,
    )
    # Untyped, as OmegaConf cannot add typed entries from the command line
    # (+data.sources.NAME={inputs:[GLOB],weight:W}); pipeline.config.compose checks each
    sources: dict[str, Any] = key(
        role=OUTPUT,
        help="a weighted mixture: NAME={inputs: [GLOB], weight: W}",
        factory=dict,
        rule=r.SOURCE_NAMES,
        common=True,
    )
    prepared: str | None = key(
        None,
        NOT_SETTING,
        "train on the tokenized data of this run folder",
        rule=r.PREPARED_RUN,
        common=True,
    )
    text_key: str = key("text", OUTPUT, "the JSON key of each record's text", rule=NOT_EMPTY)
    num_shards: int = key(4, OUTPUT, "tokenize tasks, one shard each", rule=AT_LEAST_ONE)
    merge_into: int | None = key(
        None, OUTPUT, "concatenate each split's files into this many", rule=AT_LEAST_ONE
    )
    # a pipeline.config.split_weights.Split once composed (OmegaConf types no union of str and
    # list)
    split: Any = key(
        "90,5,5", OUTPUT, "train,validation,test shares: '90,5,5' or [90,5,5]", rule=r.SPLIT
    )
    split_seed: int = key(1234, OUTPUT, "the seed of the split's hash")
    dedup: c.Dedup = key(c.Dedup.none, OUTPUT, "exact: documents of one text kept once")
    warn_epochs: float = key(
        4.0, NOT_SETTING, "the plan warns past this many epochs of a source", rule=POSITIVE
    )
    strict: bool = key(False, NOT_SETTING, "stop at the first bad record instead of counting it")
    max_epochs: float = key(
        1000.0, NOT_SETTING, "refuse a run reading a source more often", rule=POSITIVE
    )
    # each bad record is counted and logged in data/rejects/; a file none of whose records is
    # a document stops the run whatever this says
    max_reject_fraction: float = key(
        0.01, NOT_SETTING, "the share of bad records verify accepts before it stops", rule=r.SHARE
    )
    max_document_bytes: int = key(
        64 * 1024 * 1024, OUTPUT, "longer documents are rejected", rule=AT_LEAST_ONE
    )
    builtin_corpus_bytes: int = key(
        4_000_000, OUTPUT, "the size of the built-in corpus", rule=AT_LEAST_ONE
    )


@dataclass
class TokenizerConfig:
    model: str | None = key(
        None,
        OUTPUT,
        "an existing sentencepiece .model; none: train one",
        rule=r.A_FILE,
        common=True,
    )
    type: c.TokenizerType = key(c.TokenizerType.bpe, OUTPUT, "the sentencepiece model type")
    # none in a run's config.yaml beside a given tokenizer.model, whose pieces it does not set
    vocab_size: int | None = key(
        4096, OUTPUT, "pieces of a trained tokenizer", rule=r.at_least(64), common=True
    )
    sample_documents: int = key(
        200_000, OUTPUT, "documents of a seeded sample to train on", rule=AT_LEAST_ONE
    )
    max_sentence_length: int = key(16384, OUTPUT, "sentencepiece's", rule=AT_LEAST_ONE)
    character_coverage: float = key(0.9995, OUTPUT, "sentencepiece's", rule=r.PROBABILITY)
    byte_fallback: bool = key(True, OUTPUT, "unknown characters as bytes")
    lossless: bool = key(True, OUTPUT, "identity normalization: decode(encode(x)) == x")
    user_defined_symbols: list[str] = key(
        role=OUTPUT, help="pieces kept whole", factory=lambda: ["\n"]
    )
    seed: int = key(1234, OUTPUT, "the sample's and the trainer's seed")
    threads: int = key(2, NOT_SETTING, "threads of the trainer", rule=AT_LEAST_ONE)
