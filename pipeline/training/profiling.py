"""`train.profile_steps=[FIRST,LAST]`: torch.profiler over those training steps, written as a
table of where the device time went (train/profile.txt): kernels grouped by what they do
(GEMM, attention, normalization, optimizer, communication, ...), then the top kernels."""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.core import files

# First match wins; the patterns are fragments of CUDA kernel names.
CATEGORIES = [
    ("communication", r"nccl|all_?reduce|all_?gather|reduce_?scatter"),
    ("attention", r"fmha|flash|sdpa|attn|attention|fort_native"),
    ("gemm", r"gemm|nvjet|xmma|cutlass|cublas|sm90_|matmul"),
    ("optimizer", r"multi_tensor|adam|l2norm|unscale"),
    ("normalization", r"norm"),
    ("cross-entropy", r"cross_entropy|softmax|logsumexp"),
    ("rope", r"rope|rotary"),
    ("cast / fp8 scaling", r"cast|amax|quantize|fp8|scale"),
    ("elementwise", r"elementwise|vectorized|unrolled|silu|swiglu|gelu|bias|add|mul|copy|fill"),
    ("reduction", r"reduce"),
]


def category(kernel: str) -> str:
    name = kernel.lower()
    return next((c for c, pattern in CATEGORIES if re.search(pattern, name)), "other")


def device_table(events, steps: int) -> str:
    """Markdown tables from profiler key averages: device time per step by category, then
    the 25 kernels that took the most."""
    from torch.autograd import DeviceType

    kernels = [e for e in events if e.device_type == DeviceType.CUDA and e.self_device_time_total]
    total = sum(e.self_device_time_total for e in kernels) or 1
    by_category: dict[str, float] = {}
    for e in kernels:
        key = category(e.key)
        by_category[key] = by_category.get(key, 0.0) + e.self_device_time_total
    lines = [
        f"device time per step: {total / steps / 1e3:.1f} ms over {steps} step(s)",
        "",
        "| category | ms per step | share |",
        "|---|---|---|",
    ]
    for name, us in sorted(by_category.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {name} | {us / steps / 1e3:.2f} | {100 * us / total:.1f}% |")
    lines += ["", "| kernel | category | calls | ms per step | share |", "|---|---|---|---|---|"]
    for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:25]:
        us = e.self_device_time_total
        lines.append(
            f"| `{e.key[:90]}` | {category(e.key)} | {e.count // steps} | "
            f"{us / steps / 1e3:.2f} | {100 * us / total:.1f}% |"
        )
    return "\n".join(lines) + "\n"


class StepProfiler:
    """Profiles steps FIRST..LAST (1-based, inclusive) on the logging rank; a no-op otherwise."""

    def __init__(self, steps: list[int], out: Path, enabled: bool) -> None:
        self.first, self.last = (steps[0], steps[-1]) if steps and enabled else (0, -1)
        self.out = out
        self.profile = None

    def step_starts(self, step: int) -> None:
        if step != self.first:
            return
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self.profile = profile(activities=activities)
        self.profile.__enter__()

    def step_ends(self, step: int) -> None:
        if self.profile is None or step != self.last:
            return
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.profile.__exit__(None, None, None)
        events = self.profile.key_averages()
        files.write_text(self.out, device_table(events, self.last - self.first + 1))
        self.profile = None
