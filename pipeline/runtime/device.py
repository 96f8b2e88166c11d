"""The device a job computes on, and megatron-core on the CPU.

A few of megatron-core's calls name the CUDA device even where no GPU work is involved (a flag
tensor for a collective, a wait for copies that are not in flight, a token counter allocated
with device="cuda"). Within `cuda_calls_on_cpu()` and `cuda_allocations_on_cpu()`, those mean
the CPU, also on a host that has a GPU (a CPU job on a GPU node).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode


def resolve_device(setting: str) -> str:
    """train.device: "auto" is CUDA where torch sees a GPU, else the CPU."""
    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return setting


@contextlib.contextmanager
def cuda_calls_on_cpu() -> Iterator[None]:
    saved = torch.cuda.synchronize, torch.cuda.current_device
    torch.cuda.synchronize = lambda device=None: None  # nothing runs asynchronously here
    torch.cuda.current_device = lambda: "cpu"  # tensors made "on the current device"
    try:
        yield
    finally:
        torch.cuda.synchronize, torch.cuda.current_device = saved


class _CudaAllocationsOnCpu(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if kwargs.get("device") == "cuda":
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def cuda_allocations_on_cpu() -> contextlib.AbstractContextManager:
    """Tensors created with device="cuda" (megatron-core's schedules allocate their token
    counter so) are created on the CPU instead. Nothing else is touched."""
    return _CudaAllocationsOnCpu()
