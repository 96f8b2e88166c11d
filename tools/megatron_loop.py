"""A hand-written megatron-core training loop, the way a Megatron-LM user writes one, as the
baseline of tools/bench_train.py: GPTModel with Transformer Engine's layer spec, bf16 with
megatron-core's DDP and distributed optimizer, its fused kernels (RoPE, cross-entropy, bias
fusions), no pipeline code beyond the model's shape. One GPU; random tokens. A mixture-of-experts
preset (model.moe.experts > 0) gets the MoE layer as megatron-core's fastest single-GPU recipe
has it: TE grouped GEMM, the alltoall dispatcher, the fused permute and router kernels
(--no-moe-fusions: without the two fusions).

    python tools/megatron_loop.py --model gpt-1.3b --micro-batch 16 --accumulation 4
    python tools/megatron_loop.py --model moe-3.7b --micro-batch 16 --accumulation 4 --vocab 50304

Prints one JSON line: the median step time after warm-up, tokens/s, TFLOP/s and MFU
(Megatron-LM's FLOP formula; peak 989 TFLOP/s in bf16, 1979 in fp8), peak memory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SEQ = 2048
VOCAB = 32000
PEAK_TFLOPS = {"bf16": 989.0, "fp8": 1979.0}  # H100/H200 dense


def _apex_fusion() -> bool:
    """Megatron-LM's default (--gradient-accumulation-fusion) needs apex's CUDA extension."""
    try:
        import fused_weight_gradient_mlp_cuda  # noqa: F401
    except ImportError:
        return False
    return True


def _moe(m, fusions: bool) -> dict:
    """TransformerConfig's MoE fields for a preset with experts; {} for a dense one."""
    if not m.moe.experts:
        return {}
    from pipeline.model.sizes import ffn_hidden_size

    return dict(
        num_moe_experts=m.moe.experts,
        moe_router_topk=m.moe.top_k,
        moe_ffn_hidden_size=m.moe.ffn_hidden_size or ffn_hidden_size(m),
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=m.moe.aux_loss_coeff,
        moe_grouped_gemm=True,
        moe_token_dispatcher_type="alltoall",
        moe_permute_fusion=fusions,
        moe_router_fusion=fusions,
    )


def build(model_name: str, precision: str, vocab: int = VOCAB, moe_fusions: bool = True):
    import torch
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_with_transformer_engine_spec,
    )
    from megatron.core.transformer.transformer_config import TransformerConfig

    from pipeline.config import compose
    from pipeline.model.sizes import ffn_hidden_size

    m = compose("/tmp/unused", f"model={model_name}", check=False).model  # the shape alone
    fp8 = dict(fp8="hybrid", fp8_recipe="delayed", fp8_amax_history_len=1024,
               fp8_amax_compute_algo="max") if precision == "fp8" else {}  # fmt: skip
    config = TransformerConfig(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups or m.num_attention_heads,
        ffn_hidden_size=ffn_hidden_size(m),
        gated_linear_unit=m.activation == "swiglu",
        activation_func=F.silu if m.activation == "swiglu" else F.gelu,
        normalization=m.normalization,
        add_bias_linear=m.add_bias_linear,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bf16=True,
        params_dtype=torch.bfloat16,
        bias_activation_fusion=True,
        masked_softmax_fusion=True,
        apply_rope_fusion=m.position_embedding == "rope",
        cross_entropy_loss_fusion=True,
        cross_entropy_fusion_impl="te",
        gradient_accumulation_fusion=_apex_fusion(),
        **fp8,
        **_moe(m, moe_fusions),
    )
    spec = get_gpt_layer_with_transformer_engine_spec(
        num_experts=m.moe.experts or None, moe_grouped_gemm=bool(m.moe.experts)
    )
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=vocab,
        max_sequence_length=SEQ,
        share_embeddings_and_output_weights=not m.untie_embeddings,
        position_embedding_type=m.position_embedding,
        rotary_base=m.rotary_base,
    ).cuda()


def train(
    model_name: str,
    micro: int,
    accumulation: int,
    steps: int,
    warmup: int,
    precision: str,
    vocab: int = VOCAB,
    moe_fusions: bool = True,
):
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.module import Float16Module

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    net = build(model_name, precision, vocab, moe_fusions)
    config = net.config
    ddp = DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=True)
    model = DistributedDataParallel(config, ddp, Float16Module(config, net))
    config.no_sync_func = model.no_sync
    config.finalize_model_grads_func = finalize_model_grads
    optimizer = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam",
            lr=1e-4,
            bf16=True,
            params_dtype=torch.bfloat16,
            use_distributed_optimizer=True,
            clip_grad=1.0,
        ),  # fmt: skip
        [model],
    )
    positions = torch.arange(SEQ, device="cuda").unsqueeze(0).expand(micro, -1)

    def batches():
        while True:
            tokens = torch.randint(0, vocab, (micro, SEQ + 1), device="cuda")
            yield tokens[:, :-1], tokens[:, 1:]

    def forward_step(data, model):
        tokens, labels = next(data)
        per_token = model(tokens, positions, None, labels=labels)
        return per_token, lambda out: (out.float().mean(), {})

    step_fn = partial(
        get_forward_backward_func(),
        forward_step_func=forward_step,
        data_iterator=batches(),
        model=model,
        num_microbatches=accumulation,
        seq_length=SEQ,
        micro_batch_size=micro,
        forward_only=False,
    )
    torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        started = time.perf_counter()
        model.zero_grad_buffer()
        optimizer.zero_grad()
        step_fn()
        optimizer.step()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - started)
    return times, torch.cuda.max_memory_allocated() / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt-1.3b")
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--accumulation", type=int, default=4)
    parser.add_argument("--precision", choices=["bf16", "fp8"], default="bf16")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument(
        "--no-moe-fusions", action="store_true", help="MoE without fused permute and router"
    )
    args = parser.parse_args()
    from tools.bench_train import flops_per_token

    times, peak = train(args.model, args.micro_batch, args.accumulation, args.steps,
                        args.warmup, args.precision, args.vocab,
                        not args.no_moe_fusions)  # fmt: skip
    seconds = statistics.median(times)
    tokens = args.micro_batch * args.accumulation * SEQ / seconds
    tflops = tokens * flops_per_token(args.model, args.vocab) / 1e12
    # MFU against the precision's own peak, as the training stage reports it
    print(json.dumps({"step_s": seconds, "tokens_per_s": tokens, "tflops_per_gpu": tflops,
                      "mfu": tflops / PEAK_TFLOPS[args.precision], "peak_mem_gib": peak,
                      "apex_wgrad_fusion": _apex_fusion()}))  # fmt: skip


if __name__ == "__main__":
    main()
