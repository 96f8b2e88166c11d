"""Text samples from a trained model: greedy and top-k / top-p continuations of prompts, by a
plain autoregressive decode with the megatron-core model (the whole prefix for each new token)."""

from __future__ import annotations

import torch


def _next_token(logits: torch.Tensor, top_k: int, top_p: float, generator: torch.Generator) -> int:
    if top_k <= 1 and top_p <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float(), dim=-1)
    if top_k > 0:
        kth = torch.topk(probs, min(top_k, probs.numel())).values[-1]
        probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
    if 0 < top_p < 1:
        ordered, index = torch.sort(probs, descending=True)
        keep = torch.cumsum(ordered, dim=0) - ordered < top_p * ordered.sum()
        probs = torch.zeros_like(probs).scatter(0, index[keep], ordered[keep])
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))


@torch.no_grad()
def continuation(
    model: torch.nn.Module,
    sp,
    prompt: str,
    max_new_tokens: int,
    seq_length: int,
    device: torch.device,
    top_k: int = 0,
    top_p: float = 0.0,
    seed: int = 0,
) -> list[int]:
    """Token ids continuing the prompt (the prompt left out), stopping at end-of-document."""
    model.eval()
    generator = torch.Generator(device="cpu").manual_seed(seed)
    ids = sp.encode(prompt)
    prompt_length = len(ids)
    for _ in range(max_new_tokens):
        window = ids[-seq_length:]
        tokens = torch.tensor([window], device=device)
        positions = torch.arange(len(window), device=device).unsqueeze(0)
        logits = model(tokens, positions, None)  # [1, seq, vocab] without labels
        token = _next_token(logits[0, -1, : sp.vocab_size()].cpu(), top_k, top_p, generator)
        if token == sp.eos_id():
            break
        ids.append(token)
    return ids[prompt_length:]
