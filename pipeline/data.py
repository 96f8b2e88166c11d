"""Megatron's data loader over the tokenized shards: GPTDataset splits through
BlendedMegatronDatasetBuilder, and a resumable micro-batch sampler.

Train and validation come from one weighted blend of the shards (weights: training tokens per
shard). The test split's documents (`split_bounds`), exactly those no training step saw, are
read in order by the evaluation (pipeline.evalsets), not through GPTDataset.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from omegaconf import DictConfig

from pipeline import distributed, files
from pipeline.config import ConfigError, data_parallel_size
from pipeline.indexed import read_index
from pipeline.layout import RunLayout

SPLITS = ("train", "validation", "test")


class Tokenizer:
    """What GPTDataset needs of a tokenizer: its size and end-of-document id."""

    def __init__(self, vocab_size: int, eod: int):
        self.vocab_size = vocab_size
        self.eod = eod
        self.unique_identifiers = {"class": "SentencePiece", "vocab_size": vocab_size}

    @property
    def pad(self) -> int:
        return -1  # no padding token: GPTDataset then uses its own sentinel


def split_bounds(num_documents: int, split: str) -> list[tuple[int, int]]:
    """Document ranges of train/validation/test, rounded exactly as megatron-core's
    BlendedMegatronDatasetBuilder rounds them (weights normalized, cumulative bookends)."""
    weights = [float(w) for w in re.findall(r"[.0-9]+", split)]
    weights += [0.0] * (len(SPLITS) - len(weights))
    total = float(np.sum(np.array(weights, dtype=np.float64)))
    ends = np.cumsum([0.0, *(np.array(weights, dtype=np.float64) / total).tolist()]).tolist()
    bounds = []
    for begin, end in zip(ends[:-1], ends[1:], strict=True):
        if end <= begin:  # an empty split
            bounds.append((0, 0))
        else:
            bounds.append((int(round(begin * num_documents)), int(round(end * num_documents))))
    return bounds


def split_tokens(prefix: str, split: str) -> dict[str, int]:
    """Tokens in each split of one shard. megatron-core splits documents, not sequences: an
    empty document has no sequence, so document d's sequences are doc_index[d]..doc_index[d+1]."""
    index = read_index(f"{prefix}.idx")
    ends = np.concatenate([[0], np.cumsum(index.sequence_lengths, dtype=np.int64)])
    doc_index = index.document_indices
    return {
        name: int(ends[doc_index[end]] - ends[doc_index[beg]])
        for name, (beg, end) in zip(SPLITS, split_bounds(len(doc_index) - 1, split), strict=True)
    }


@dataclass(frozen=True)
class Sizes:
    train: int
    validation: int

    @classmethod
    def of(cls, cfg: DictConfig) -> Sizes:
        t = cfg.train
        dp = data_parallel_size(cfg)
        return cls(t.steps * t.global_batch_size, t.eval_iters * t.micro_batch_size * dp)


def check_splits(manifest: dict, cfg: DictConfig) -> None:
    """Refuse train or validation splits too small to give one sample: megatron-core would
    loop forever on them."""
    need = cfg.model.seq_length + 1
    for shard in manifest["shards"]:
        for name, tokens in shard["split_tokens"].items():
            if name != "test" and tokens < need:
                raise ConfigError(
                    f"data.split: the {name} split of {shard['prefix']} has {tokens} tokens, "
                    f"fewer than one sequence of model.seq_length+1={need}; use fewer "
                    f"data.num_shards, a larger {name} share, or more data"
                )


def _config(cfg: DictConfig, manifest: dict):
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig

    layout = RunLayout.of(cfg.workdir)
    shards = manifest["shards"]
    prefixes = [str(layout.root / s["prefix"]) for s in shards]
    weights = [float(s["split_tokens"]["train"]) for s in shards]
    return GPTDatasetConfig(
        random_seed=cfg.train.seed,
        sequence_length=cfg.model.seq_length,
        blend=(prefixes, weights),
        split=cfg.data.split,
        path_to_cache=str(layout.index_cache),
        tokenizer=Tokenizer(manifest["vocab_size"], manifest["eod_id"]),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        mmap_bin_files=True,
    )


def load_manifest(cfg: DictConfig) -> dict:
    return files.read_json(RunLayout.of(cfg.workdir).manifest)


def _build(cfg: DictConfig, manifest: dict, sizes: list[int]):
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset

    check_splits(manifest, cfg)
    logging.getLogger("megatron.core.datasets").setLevel(logging.WARNING)
    builder = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, _config(cfg, manifest))
    with distributed.group_for_this_call():  # the blended dataset asks for a rank even alone
        return builder.build()


def train_valid_datasets(cfg: DictConfig, manifest: dict | None = None):
    """The training and validation datasets, sized for the whole run."""
    sizes = Sizes.of(cfg)
    manifest = manifest or load_manifest(cfg)
    train, valid, _ = _build(cfg, manifest, [sizes.train, sizes.validation, 0])
    return train, valid


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
