"""The compiled RoPE kernel over the unsplit QKV tensor (pipeline.model.backends.rope) computes
what megatron-core's own RoPE does after its QKV split, forwards and backwards. Compiled here by
torch.compile for the CPU; on a GPU host the same code becomes Triton kernels
(tests/gpu covers that path's loss curve)."""

from __future__ import annotations

import pytest
import torch

from pipeline.model.backends.rope import compiled_split_and_rotate, split_and_rotate

pytestmark = pytest.mark.integration


def megatron_reference(mixed, q_freqs, k_freqs, split):
    """megatron-core's path: split the QKV tensor, then its unfused RoPE on query and key."""
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

    query, key, value = torch.split(mixed, list(split), dim=3)
    seq, batch, _, head = key.shape
    query = query.reshape(seq, batch, -1, head)
    return (
        _apply_rotary_pos_emb_bshd(query, q_freqs),
        _apply_rotary_pos_emb_bshd(key, k_freqs),
        value,
    )


def freqs(seq: int, dim: int) -> torch.Tensor:
    inverse = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float64), inverse)
    return torch.cat((angles, angles), dim=-1)[:, None, None, :]


def test_the_compiled_kernel_matches_megatrons_rope_forwards_and_backwards():
    torch.manual_seed(0)
    seq, batch, head, groups, q_per_group = 16, 3, 8, 2, 3  # grouped-query attention
    split = (q_per_group * head, head, head)
    mixed = torch.randn(seq, batch, groups, (q_per_group + 2) * head, dtype=torch.float64)
    f = freqs(seq, head)
    upstream = [torch.randn_like(t) for t in megatron_reference(mixed, f, f, split)]

    def outputs_and_grad(fn, dtype):
        x = mixed.to(dtype).clone().requires_grad_()
        outs = fn(x, f.float(), f.float(), split)
        torch.autograd.backward(outs, [u.to(dtype) for u in upstream])
        return [o.detach().double() for o in outs], x.grad.double()

    ref_outs, ref_grad = outputs_and_grad(megatron_reference, torch.float64)
    for fn in (split_and_rotate, compiled_split_and_rotate):
        outs, grad = outputs_and_grad(fn, torch.float32)
        for out, ref in zip(outs, ref_outs, strict=True):
            assert out.shape == ref.shape
            assert torch.linalg.norm(out - ref) / torch.linalg.norm(ref) < 1e-6
        assert torch.linalg.norm(grad - ref_grad) / torch.linalg.norm(ref_grad) < 1e-6
    # bf16: rotated in fp32 and rounded once, so within bf16's rounding of the reference
    outs, grad = outputs_and_grad(compiled_split_and_rotate, torch.bfloat16)
    for out, ref in zip(outs, ref_outs, strict=True):
        assert torch.linalg.norm(out - ref) / torch.linalg.norm(ref) < 5e-3
    assert torch.linalg.norm(grad - ref_grad) / torch.linalg.norm(ref_grad) < 5e-3
