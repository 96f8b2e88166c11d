"""Training FLOPs with Megatron-LM's formula (`num_floating_point_operations`), and peaks."""

from __future__ import annotations

from omegaconf import DictConfig

from pipeline.model import ffn_hidden_size, padded_vocab_size

# Dense bf16/fp16 tensor-core peaks, TFLOP/s, by device name fragment (fp8 is twice these).
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "B200": 2250.0}


def flops_per_sequence(cfg: DictConfig, vocab_size: int) -> float:
    """Forward and backward FLOPs of one sequence: 3 GEMM passes x 2 GEMMs x 2 FLOPs per MAC."""
    m = cfg.model
    s, h, layers = m.seq_length, m.hidden_size, m.num_layers
    heads = m.num_attention_heads
    groups = m.num_query_groups or heads
    kv_channels = h // heads
    query_projection_ratio = kv_channels * heads / h
    gated = 1.5 if m.activation == "swiglu" else 1.0
    attention = (1 + groups / heads + s / h) * query_projection_ratio
    mlp = ffn_hidden_size(m) / h * gated
    logits = padded_vocab_size(vocab_size, cfg) / (2 * layers * h)
    return 12.0 * s * layers * h * h * (attention + mlp + logits)


def peak_tflops(device_name: str, precision: str) -> float | None:
    for fragment, peak in PEAK_TFLOPS.items():
        if fragment in device_name:
            return peak * (2 if precision == "fp8" else 1)
    return None
