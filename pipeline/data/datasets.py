"""Megatron's data loader over the tokenized shards: GPTDataset splits through
BlendedMegatronDatasetBuilder, and a resumable micro-batch sampler.

Train and validation come from one weighted blend of the shards (weights: training tokens per
shard). The test split's documents (`splits.split_bounds`), exactly those no training step saw,
are read in order by the evaluation (pipeline.data.evalsets), not through GPTDataset.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

from pipeline.config import PipelineConfig
from pipeline.config.derived import validation_samples
from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.data.splits import check_splits
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


@dataclass(frozen=True)
class Sizes:
    """Samples each split must provide over the whole run."""

    train: int
    validation: int

    @classmethod
    def of(cls, cfg: PipelineConfig) -> Sizes:
        t = cfg.train
        return cls(t.steps * t.global_batch_size, validation_samples(cfg))


def load_manifest(paths: RunPaths) -> dict:
    """data/manifest.json, which the verify step writes last."""
    return files.read_json(paths.manifest)


def vocab_size(cfg: PipelineConfig) -> tuple[int, str]:
    """The run's vocabulary and where it was read: the data manifest (of this run, or of
    data.prepared) once tokenized, else tokenizer.vocab_size."""
    for run in (cfg.workdir, cfg.data.prepared):
        if run and RunPaths.of(run).manifest.exists():
            manifest = RunPaths.of(run).manifest
            return int(load_manifest(RunPaths.of(run))["vocab_size"]), str(manifest)
    return int(cfg.tokenizer.vocab_size), "tokenizer.vocab_size"


def _config(cfg: PipelineConfig, manifest: dict):
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig

    paths = RunPaths.of(cfg.workdir)
    shards = manifest["shards"]
    prefixes = [str(paths.root / s["prefix"]) for s in shards]
    weights = [float(s["split_tokens"]["train"]) for s in shards]
    return GPTDatasetConfig(
        random_seed=cfg.train.seed,
        sequence_length=cfg.model.seq_length,
        blend=(prefixes, weights),
        split=manifest["split"],  # as the data was split, which the manifest records
        path_to_cache=str(paths.index_cache),
        tokenizer=VocabInfo(manifest["vocab_size"], manifest["eod_id"]),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        mmap_bin_files=True,
    )


def _build(cfg: PipelineConfig, manifest: dict, sizes: list[int]):
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset

    check_splits(manifest, cfg.model.seq_length)
    logging.getLogger("megatron.core.datasets").setLevel(logging.WARNING)
    builder = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, _config(cfg, manifest))
    with distributed.group_for_this_call():  # the blended dataset asks for a rank even alone
        return builder.build()


def train_valid_datasets(cfg: PipelineConfig, manifest: dict | None = None):
    """The training and validation datasets, sized for the whole run."""
    sizes = Sizes.of(cfg)
    manifest = manifest or load_manifest(RunPaths.of(cfg.workdir))
    train, valid, _ = _build(cfg, manifest, [sizes.train, sizes.validation, 0])
    return train, valid


class FirstSamples:
    """The first `count` samples of a dataset, padded with fully masked samples to a multiple
    of `multiple` (micro-batch x data-parallel size): every rank runs whole micro-batches, and
    the loss counts exactly those `count` samples, whatever the micro-batch size."""

    def __init__(self, dataset, count: int, multiple: int) -> None:
        self.dataset, self.count = dataset, count
        self.length = -(-count // multiple) * multiple

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict:
        if index < self.count:
            return self.dataset[index]
        sample = dict(self.dataset[0])
        sample["loss_mask"] = sample["loss_mask"] * 0
        return sample


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
