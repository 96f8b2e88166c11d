"""Host memory that a background save's tensors are copied into, kept from one save to the next.

megatron-core's own staging copies every tensor to freshly allocated, pageable host memory at
each save: the copy runs at a fraction of the link's speed, and the kernel zeroes each new page
first, while training waits. Here each tensor has its buffer, reused from save to save:
anonymous shared memory, so the forked writer reads the very pages (a private copy-on-write
mapping of pinned pages would be copied whole at the fork), registered with CUDA (pinned) so
the copy from the GPU runs at full speed. The next save starts only after the writer has
finished with them (pipeline.training.saver keeps one save in flight).

Pinning many GB takes seconds (the kernel faults in and locks every page), so `reserve` does it
for the size the run's saves will need in a thread at the start of training, through the CUDA
runtime called from ctypes, which lets the training loop's thread run meanwhile; the first save
then carves its buffers from that arena. Registered memory is unregistered before it is
unmapped (`close`): CUDA would otherwise keep the stale mapping, and a later registration of
the same addresses (the evaluation's, in the same process) fails.
"""

from __future__ import annotations

import ctypes
import mmap
import threading
import warnings
import weakref

import torch

# megatron-core's write buckets: (file path, file name, (byte items, [(write item, tensor)]))
WriteBucket = tuple
PORTABLE = 1  # cudaHostRegisterPortable: pinned for every device's context, whichever thread
ALIGN = 4096


class HostStaging:
    def __init__(self) -> None:
        self._buffers: dict[tuple[str, int], torch.Tensor] = {}
        self._pinned: dict[int, int] = {}  # registered address -> size
        self._pinning = torch.cuda.is_available()
        self._arena: mmap.mmap | None = None
        self._arena_used = 0
        self._reserving: threading.Thread | None = None
        self._finalizer = weakref.finalize(self, _unpin_all, self._pinned)

    def reserve(self, nbytes: int) -> None:
        """Map and pin `nbytes` of host memory in a thread, for the first save to use."""
        if not self._pinning or nbytes <= 0 or self._arena is not None:
            return
        self._arena = mmap.mmap(-1, nbytes, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        address = ctypes.addressof(ctypes.c_char.from_buffer(self._arena))
        device = torch.cuda.current_device()
        self._reserving = threading.Thread(
            target=self._pin_address, args=(address, nbytes, device), daemon=True
        )
        self._reserving.start()

    def preload(self, write_buckets: list[WriteBucket]) -> list[WriteBucket]:
        """The buckets with each tensor replaced by its host copy, taken now (megatron-core's
        `preload_fn`: called while training waits, before the writer is forked)."""
        if self._reserving is not None:  # the arena, pinned by now unless the run is short
            self._reserving.join()
            self._reserving = None
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

    def close(self) -> None:
        """Unregister and drop every buffer (the end of training)."""
        if self._reserving is not None:
            self._reserving.join()
            self._reserving = None
        _unpin_all(self._pinned)
        self._buffers.clear()
        self._arena = None

    def _buffer(self, key: tuple[str, int], like: torch.Tensor) -> torch.Tensor:
        kept = self._buffers.get(key)
        if kept is not None and kept.shape == like.shape and kept.dtype == like.dtype:
            return kept
        if kept is not None and kept.data_ptr() in self._pinned:  # one of its own mapping
            _unregister(kept.data_ptr())
            del self._pinned[kept.data_ptr()]
        buffer = self._allocate(like)
        self._buffers[key] = buffer
        return buffer

    def _allocate(self, like: torch.Tensor) -> torch.Tensor:
        """A buffer of its own storage (torch.save writes a tensor's whole storage): carved
        from the arena while it lasts, else mapped and pinned now."""
        size = like.numel() * like.element_size()
        if size == 0:
            return torch.empty(like.shape, dtype=like.dtype)
        arena = self._arena
        if arena is not None and self._arena_used + size <= len(arena):
            buffer = torch.frombuffer(
                arena, dtype=like.dtype, count=like.numel(), offset=self._arena_used
            )
            self._arena_used += -(-size // ALIGN) * ALIGN
            return buffer.view(like.shape)
        memory = mmap.mmap(-1, size, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        buffer = torch.frombuffer(memory, dtype=like.dtype).view(like.shape)
        if self._pinning and like.is_cuda:
            self._pin_address(buffer.data_ptr(), size, torch.cuda.current_device())
        return buffer

    def _pin_address(self, address: int, size: int, device: int) -> None:
        code = _register(address, size, device)
        if code == 0:
            self._pinned[address] = size
        else:
            self._pinning = False  # copies still work from pageable memory, at a lower speed
            warnings.warn(
                f"could not pin host memory for background checkpoint saves (cudaHostRegister "
                f"error {code}); saves block training for longer",
                stacklevel=2,
            )


def _unpin_all(pinned: dict[int, int]) -> None:
    for address in list(pinned):
        _unregister(address)
        del pinned[address]


def _unregister(address: int) -> None:
    cudart = _cuda_runtime()
    if cudart is None:
        torch.cuda.cudart().cudaHostUnregister(address)
    else:
        cudart.cudaHostUnregister(ctypes.c_void_p(address))


def _register(address: int, size: int, device: int) -> int:
    """cudaHostRegister on `device`: through ctypes, which lets other threads run meanwhile,
    else through torch's binding, which holds the GIL."""
    cudart = _cuda_runtime()
    if cudart is None:
        torch.cuda.set_device(device)
        return int(torch.cuda.cudart().cudaHostRegister(address, size, PORTABLE))
    cudart.cudaSetDevice(ctypes.c_int(device))
    register = cudart.cudaHostRegister
    register.restype = ctypes.c_int
    return int(register(ctypes.c_void_p(address), ctypes.c_size_t(size), ctypes.c_uint(PORTABLE)))


_RUNTIME: list[ctypes.CDLL | None] = []


def _cuda_runtime() -> ctypes.CDLL | None:
    """The CUDA runtime library torch has loaded (found in this process's memory map), or None."""
    if not _RUNTIME:
        _RUNTIME.append(_loaded_cudart())
    return _RUNTIME[0]


def _loaded_cudart() -> ctypes.CDLL | None:
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart.so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None
