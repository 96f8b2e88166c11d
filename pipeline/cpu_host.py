"""megatron-core for a job on the CPU: a few of its calls name the CUDA device even where no GPU
work is involved (a flag tensor for a collective, a wait for copies that are not in flight).
Within `cuda_calls_on_cpu()`, those calls mean the CPU, also on a host that has a GPU."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def cuda_calls_on_cpu() -> Iterator[None]:
    saved = torch.cuda.synchronize, torch.cuda.current_device
    torch.cuda.synchronize = lambda device=None: None  # nothing runs asynchronously here
    torch.cuda.current_device = lambda: "cpu"  # tensors made "on the current device"
    try:
        yield
    finally:
        torch.cuda.synchronize, torch.cuda.current_device = saved
