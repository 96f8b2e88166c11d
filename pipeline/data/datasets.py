"""Megatron's data loader over the tokenized data: GPTDataset through
BlendedMegatronDatasetBuilder over the training files of every source, sampled by the sources'
weights, and a resumable micro-batch sampler.

The validation and test splits are files of their own (pipeline.data.split_assignment);
evaluation and validation read them in order (pipeline.data.evalsets), not through GPTDataset.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

from pipeline.config import PipelineConfig
from pipeline.config.derived import given_tokenizer
from pipeline.core import files
from pipeline.core.errors import ConfigError
from pipeline.core.paths import RunPaths
from pipeline.data import shards, sources
from pipeline.data.documents import source_where_key
from pipeline.data.tokenizer import load as load_tokenizer
from pipeline.runtime import distributed


class VocabInfo:
    """What GPTDataset needs of the tokenizer (its `tokenizer` argument): the vocabulary size
    and the end-of-document id."""

    def __init__(self, vocab_size: int, eod: int):
        self.vocab_size = vocab_size
        self.eod = eod
        self.unique_identifiers = {"class": "SentencePiece", "vocab_size": vocab_size}

    @property
    def pad(self) -> int:
        return -1  # no padding token: GPTDataset then uses its own sentinel


def load_manifest(paths: RunPaths) -> dict:
    """data/manifest.json, which the verify step writes last; data of an earlier format is
    refused."""
    shards.refuse_earlier_format(paths)
    return files.read_json(paths.manifest)


def check_sources(cfg: PipelineConfig, manifest: dict) -> None:
    """The sources the config weighs are those the data holds."""
    named = [s.name for s in sources.of(cfg.data)]
    held = list(manifest["sources"])
    if sorted(named) != sorted(held):
        raise ConfigError(
            f"data.sources: the tokenized data holds {', '.join(held)}, the config names "
            f"{', '.join(named)}; name the same sources (their weights may differ)"
        )


def needed_splits(cfg: PipelineConfig) -> tuple[str, ...]:
    """The splits the configured stages read."""
    needed = ("train", "validation") if "train" in cfg.stages else ()
    return needed + (("test",) if "evaluate" in cfg.stages else ())


def check_splits(manifest: dict, seq_length: int, needed: tuple[str, ...]) -> None:
    """Refuse a split that a stage reads but that is too small to give one sequence of every
    source: megatron-core would loop forever on an empty one, and a loss over a few tokens says
    nothing. Where a source's row filter left out most of its rows, the filter is named."""
    need = seq_length + 1
    many = len(manifest["sources"]) > 1
    for name, source in manifest["sources"].items():
        for split in needed:
            tokens = source["split_tokens"][split]
            if tokens >= need:
                continue
            of = f" of source {name}" if many else ""
            small = (
                f"the {split} split{of} has {tokens} tokens, fewer than one sequence of "
                f"model.seq_length+1={need}"
            )
            larger = (
                f"give {split} a larger share of data.split={manifest['split']!r} and tokenize "
                "again (force=tokenize: each document's split is decided when it is tokenized)"
            )
            filtered = source.get("filtered", 0)
            rows = filtered + source["documents"] + source["no_token_documents"]
            rows += sum(source["rejected"].values())
            if filtered and filtered >= rows / 2:
                raise ConfigError(
                    f"{source_where_key(name)}: left out {filtered:,} of the {rows:,} rows of "
                    f"source {name}, and {small}; loosen the filter, or {larger}"
                )
            raise ConfigError(f"data.split: {small}; {larger}, or give more data")


def check_data(cfg: PipelineConfig, manifest: dict) -> None:
    """What the stages read is there: the sources the config weighs, each split big enough."""
    check_sources(cfg, manifest)
    check_splits(manifest, cfg.model.seq_length, needed_splits(cfg))


def vocab_size(cfg: PipelineConfig) -> tuple[int, str]:
    """The run's vocabulary and where it was read: the data manifest (of this run, or of
    data.prepared) once tokenized, else the given tokenizer (tokenizer.model, or
    model.init_from's), else tokenizer.vocab_size, the size of the one to train."""
    for run in (cfg.workdir, cfg.data.prepared):
        if run and RunPaths.of(run).manifest.exists():
            manifest = RunPaths.of(run).manifest
            return int(files.read_json(manifest)["vocab_size"]), str(manifest)
    given = given_tokenizer(cfg)
    if given and os.path.isfile(given):
        return load_tokenizer(given).vocab_size(), given
    return int(cfg.tokenizer.vocab_size), "tokenizer.vocab_size"


def train_samples(cfg: PipelineConfig) -> int:
    """Sequences the training run draws over all its steps."""
    return cfg.train.steps * cfg.train.global_batch_size


def train_blend(cfg: PipelineConfig, manifest: dict) -> tuple[list[str], list[float]]:
    """Every training file with its sampling weight: its source's weight, shared among the
    source's files by their tokens."""
    root = RunPaths.of(cfg.workdir).root
    prefixes, weights = [], []
    for name, share in sources.weights(cfg.data).items():
        own = manifest["sources"][name]["files"]["train"]
        tokens = sum(f["tokens"] for f in own)
        for f in own:
            prefixes.append(str(root / f["prefix"]))
            weights.append(share * f["tokens"] / tokens)
    return prefixes, weights


def _config(cfg: PipelineConfig, manifest: dict):
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig

    return GPTDatasetConfig(
        random_seed=cfg.train.seed,
        sequence_length=cfg.model.seq_length,
        blend_per_split=[train_blend(cfg, manifest), None, None],  # only train: files of its own
        path_to_cache=str(RunPaths.of(cfg.workdir).index_cache),
        tokenizer=VocabInfo(manifest["vocab_size"], manifest["eod_id"]),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        mmap_bin_files=True,
    )


def train_dataset(cfg: PipelineConfig, manifest: dict | None = None):
    """The training dataset, sized for the whole run."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset

    manifest = manifest or load_manifest(RunPaths.of(cfg.workdir))
    check_sources(cfg, manifest)
    check_splits(manifest, cfg.model.seq_length, ("train",))
    logging.getLogger("megatron.core.datasets").setLevel(logging.WARNING)
    sizes = [train_samples(cfg), 0, 0]
    builder = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, _config(cfg, manifest))
    with distributed.group_for_this_call():  # the blended dataset asks for a rank even alone
        return builder.build()[0]


class MicroBatchSampler:
    """Indices of this data-parallel rank's micro-batches, from sample `start` on: micro-batch k
    of the whole job covers samples [start + k*mbs*dp, start + (k+1)*mbs*dp), and rank r takes
    its r-th slice. Resuming at `start = consumed samples` continues exactly where a run left off.
    """

    def __init__(
        self, total: int, micro_batch_size: int, dp_rank: int, dp_size: int, start: int = 0
    ):
        self.total, self.mbs, self.rank, self.size, self.start = (
            total,
            micro_batch_size,
            dp_rank,
            dp_size,
            start,
        )

    def __iter__(self) -> Iterator[list[int]]:
        step = self.mbs * self.size
        for first in range(self.start, self.total - step + 1, step):
            begin = first + self.rank * self.mbs
            yield list(range(begin, begin + self.mbs))

    def __len__(self) -> int:
        return max(0, (self.total - self.start) // (self.mbs * self.size))


def loader(dataset, sampler: MicroBatchSampler, workers: int = 0):
    import torch

    return torch.utils.data.DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=workers,
        pin_memory=torch.cuda.is_available(),
        persistent_workers=workers > 0,
    )
