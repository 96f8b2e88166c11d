"""Train, validation and test splits of the tokenized shards, as megatron-core draws them.

megatron-core splits each indexed dataset by documents, in order, with the weights of
data.split; `split_bounds` rounds exactly as its BlendedMegatronDatasetBuilder does, so the
evaluation reads as its test split the very documents no training step saw.
"""

from __future__ import annotations

import re

import numpy as np

from pipeline.core.errors import ConfigError
from pipeline.data.indexed import read_index

SPLITS = ("train", "validation", "test")


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


def check_splits(manifest: dict, seq_length: int) -> None:
    """Refuse train or validation splits too small to give one sample: megatron-core would
    loop forever on them."""
    need = seq_length + 1
    for shard in manifest["shards"]:
        for name, tokens in shard["split_tokens"].items():
            if name != "test" and tokens < need:
                raise ConfigError(
                    f"data.split: the {name} split of {shard['prefix']} has {tokens} tokens, "
                    f"fewer than one sequence of model.seq_length+1={need}; use fewer "
                    f"data.num_shards, a larger {name} share, or more data"
                )
