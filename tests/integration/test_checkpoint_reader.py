"""A checkpoint read by several threads gives every tensor exactly as one thread does, each
item read once, the plan split in file order into runs of about equal bytes."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing import ShardedTensor

from pipeline.model import dist_checkpoint
from pipeline.model.checkpoint_reader import ThreadedReader, threaded_reading

SHAPES = [(64, 32), (1000,), (3, 5, 7), (4096, 16), (10,), (128, 128)] * 3


@pytest.fixture
def one_rank():
    """A job of one gloo rank, as megatron-core's checkpointing needs a process group."""
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if started:
        dist.destroy_process_group()


def _saved(folder) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    tensors = {f"w{i}": torch.randn(shape, generator=g) for i, shape in enumerate(SHAPES)}
    state = {k: ShardedTensor.from_rank_offsets(k, v) for k, v in tensors.items()}
    dist_checkpoint.save(folder, state, on_cpu=True)
    return tensors


def _load(folder, tensors, threads: int) -> tuple[dict, list[ThreadedReader]]:
    wanted = {
        k: ShardedTensor.from_rank_offsets(k, torch.zeros_like(v)) for k, v in tensors.items()
    }
    with threaded_reading(threads) as made:
        return dist_checkpointing.load(wanted, str(folder / dist_checkpoint.FOLDER)), made


def test_four_threads_read_what_one_reads(tmp_path, one_rank):
    tensors = _saved(tmp_path)
    alone, alone_readers = _load(tmp_path, tensors, 1)
    shared, shared_readers = _load(tmp_path, tensors, 4)
    assert [r.runs_read for r in alone_readers] == [1]
    assert [r.runs_read for r in shared_readers] == [4]
    for key, tensor in tensors.items():
        assert torch.equal(alone[key], tensor), key
        assert torch.equal(shared[key], tensor), key


def test_the_plan_is_cut_in_file_order_into_runs_of_about_equal_bytes(tmp_path, one_rank):
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    tensors = _saved(tmp_path)
    seen = []

    class Recording(ThreadedReader):
        def split(self, plan):
            seen.append((plan, super().split(plan)))
            return seen[-1][1]

    reader = Recording(tmp_path / dist_checkpoint.FOLDER, threads=3)
    target = {k: torch.zeros_like(v) for k, v in tensors.items()}
    dcp_load(target, storage_reader=reader, planner=DefaultLoadPlanner())
    ((plan, runs),) = seen
    assert len(runs) == 3
    in_runs = [item for run in runs for item in run]
    assert sorted(map(id, in_runs)) == sorted(map(id, plan.items))  # each item once
    place = [(reader.storage_data[i.storage_index].relative_path,
              reader.storage_data[i.storage_index].offset) for i in in_runs]  # fmt: skip
    assert place == sorted(place)
    sizes = [sum(reader.storage_data[i.storage_index].length for i in run) for run in runs]
    largest_item = max(reader.storage_data[i.storage_index].length for i in plan.items)
    assert max(sizes) - min(sizes) <= 2 * largest_item
    for key, tensor in tensors.items():
        assert torch.equal(target[key], tensor), key
