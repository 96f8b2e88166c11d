"""Host memory that a background save's tensors are copied into, kept from one save to the next.

megatron-core's own staging copies every tensor to freshly allocated, pageable host memory at
each save: the copy runs at a fraction of the link's speed, and the kernel zeroes each new page
first, while training waits. Here each tensor has its buffer, allocated at the first save and
reused after: anonymous shared memory, so the forked writer reads the very pages (a private
copy-on-write mapping of pinned pages would be copied whole at the fork), registered with CUDA
(pinned) so the copy from the GPU runs at full speed. The next save starts only after the
writer has finished with them (pipeline.training.saver keeps one save in flight).
"""

from __future__ import annotations

import mmap
import warnings

import torch

# megatron-core's write buckets: (file path, file name, (byte items, [(write item, tensor)]))
WriteBucket = tuple


class HostStaging:
    def __init__(self) -> None:
        self._buffers: dict[tuple[str, int], torch.Tensor] = {}
        self._pinned: set[int] = set()  # data pointers registered with CUDA
        self._pinning = torch.cuda.is_available()

    def preload(self, write_buckets: list[WriteBucket]) -> list[WriteBucket]:
        """The buckets with each tensor replaced by its host copy, taken now (megatron-core's
        `preload_fn`: called while training waits, before the writer is forked)."""
        staged_buckets = []
        copied_from_gpu = False
        for path, name, (byte_items, tensor_items) in write_buckets:
            staged = []
            for index, (item, tensor) in enumerate(tensor_items):
                host = self._buffer((name, index), tensor)
                host.copy_(tensor.detach(), non_blocking=tensor.is_cuda)
                copied_from_gpu |= tensor.is_cuda
                staged.append((item, host))
            staged_buckets.append((path, name, (byte_items, staged)))
        if copied_from_gpu:
            torch.cuda.synchronize()
        return staged_buckets

    def _buffer(self, key: tuple[str, int], like: torch.Tensor) -> torch.Tensor:
        kept = self._buffers.get(key)
        if kept is not None and kept.shape == like.shape and kept.dtype == like.dtype:
            return kept
        if kept is not None:
            self._release(kept)
        buffer = self._allocate(like)
        self._buffers[key] = buffer
        return buffer

    def _allocate(self, like: torch.Tensor) -> torch.Tensor:
        size = like.numel() * like.element_size()
        if size == 0:
            return torch.empty(like.shape, dtype=like.dtype)
        # a tensor of its own storage: torch.save writes a tensor's whole storage
        memory = mmap.mmap(-1, size, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        buffer = torch.frombuffer(memory, dtype=like.dtype).view(like.shape)
        if self._pinning and like.is_cuda:
            self._pin(buffer, size)
        return buffer

    def _pin(self, buffer: torch.Tensor, size: int) -> None:
        cudart = torch.cuda.cudart()
        if int(cudart.cudaHostRegister(buffer.data_ptr(), size, 0)) == 0:
            self._pinned.add(buffer.data_ptr())
        else:
            self._pinning = False  # copies still work from pageable memory, at a lower speed
            warnings.warn(
                "could not pin host memory for background checkpoint saves (cudaHostRegister "
                "failed); saves block training for longer",
                stacklevel=3,
            )

    def _release(self, buffer: torch.Tensor) -> None:
        if buffer.data_ptr() in self._pinned:
            self._pinned.discard(buffer.data_ptr())
            torch.cuda.cudart().cudaHostUnregister(buffer.data_ptr())
