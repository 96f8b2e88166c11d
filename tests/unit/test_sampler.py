"""The micro-batch sampler: each data-parallel rank its own slice, resumable at any sample."""

from __future__ import annotations

from pipeline.data.datasets import MicroBatchSampler


def test_sampler_resumes_exactly_where_it_stopped():
    whole = list(MicroBatchSampler(100, 4, dp_rank=1, dp_size=2))
    resumed = list(MicroBatchSampler(100, 4, dp_rank=1, dp_size=2, start=40))
    assert resumed == whole[5:]
    rank0 = list(MicroBatchSampler(100, 4, dp_rank=0, dp_size=2))
    assert not {i for b in whole for i in b} & {i for b in rank0 for i in b}
