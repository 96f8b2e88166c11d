"""Rotary position embeddings over the fused QKV projection as one compiled kernel each way.

megatron-core hands the unsplit QKV tensor to Transformer Engine's fused kernel
(`fused_single_qkv_rope`); on an H200 that kernel moves its bytes at about a quarter of the
memory bandwidth (112 ms of a 2.0 s gpt-1.3b step, docs/benchmarks.md). Here torch.compile fuses
the split, the rotation of query and key (in fp32, rounded once, as TE does) and, backwards,
the gradients of all three into the QKV gradient, each in one pass over the tensor.
"""

from __future__ import annotations

from typing import Any

import torch


def _rotate(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin on the first freqs.shape[-1] features of each head."""
    dim = freqs.shape[-1]
    rotated, passed = x[..., :dim].float(), x[..., dim:]
    first, second = rotated.chunk(2, dim=-1)
    half_turn = torch.cat((-second, first), dim=-1)
    out = rotated * torch.cos(freqs) + half_turn * torch.sin(freqs)
    return torch.cat((out.to(x.dtype), passed), dim=-1)


def split_and_rotate(
    mixed_qkv: torch.Tensor,
    q_freqs: torch.Tensor,
    k_freqs: torch.Tensor,
    split: tuple[int, int, int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[seq, batch, groups, (q_per_group + 2) * head] -> query [seq, batch, heads, head],
    key and value [seq, batch, groups, head], query and key rotated; freqs [seq, 1, 1, dim]."""
    query, key, value = torch.split(mixed_qkv, list(split), dim=3)
    seq, batch, _, head = key.shape
    query = query.reshape(seq, batch, -1, head)
    return _rotate(query, q_freqs), _rotate(key, k_freqs), value


compiled_split_and_rotate = torch.compile(split_and_rotate, fullgraph=True)


def use_compiled_kernel() -> None:
    """Route megatron-core's unsplit-QKV RoPE through the compiled kernel. Its attention module
    looks the function up when it runs, so this holds for models built before or after; calls
    the kernel does not cover (other frequency shapes or arguments) go on to Transformer
    Engine's."""
    from megatron.core.transformer import attention

    original = attention.apply_fused_qkv_rotary_pos_emb
    if getattr(original, "compiled_kernel", False):
        return

    def apply(mixed_qkv, q_freqs, k_freqs, split, *args: Any, **kwargs: Any):
        if args or kwargs or q_freqs.shape[1:3] != (1, 1) or k_freqs.shape[1:3] != (1, 1):
            return original(mixed_qkv, q_freqs, k_freqs, split, *args, **kwargs)
        return compiled_split_and_rotate(mixed_qkv, q_freqs, k_freqs, tuple(split))

    apply.compiled_kernel = True
    attention.apply_fused_qkv_rotary_pos_emb = apply
