"""The GPU backend: Transformer Engine layers and fused kernels, megatron-core's
DistributedDataParallel and distributed optimizer (TE's fused Adam), mixed precision
(bf16, fp16 with dynamic loss scaling, fp8 through TE recipes) and distributed checkpoints."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch

from pipeline.config import PipelineConfig
from pipeline.config.derived import data_parallel_size, settled
from pipeline.model import dist_checkpoint, moe
from pipeline.model.backends import names
from pipeline.model.sizes import params_dtype
from pipeline.runtime import distributed

# Two fp8 recipes users ask for by name: delayed scaling (amax history) and per-tensor current
# scaling ("tensorwise").
FP8_RECIPES = {"delayed": "delayed", "tensorwise": "tensorwise"}


def _apex_available() -> bool:
    try:
        import fused_weight_gradient_mlp_cuda  # noqa: F401  (NVIDIA apex, never the PyPI "apex")
    except ImportError:
        return False
    return True


def _fused_qkv_rope_available() -> bool:
    """megatron-core's unsplit-QKV RoPE path, which needs Transformer Engine's kernel for it
    (newer TE releases)."""
    try:
        from transformer_engine.pytorch.attention.rope import (  # noqa: F401
            apply_fused_qkv_rotary_pos_emb,
        )
    except ImportError:
        return False
    return True


def _compiled_rope(cfg: PipelineConfig) -> bool:
    """RoPE by pipeline.model.backends.rope, on the unsplit QKV path of megatron-core."""
    return (
        cfg.train.compiled_rope
        and cfg.model.position_embedding == "rope"
        and _fused_qkv_rope_available()
    )


def _require_fp8() -> None:
    """fp8 GEMMs need Transformer Engine's fp8 support on this GPU (compute capability 8.9+)."""
    import transformer_engine.pytorch as te

    if not te.is_fp8_available():
        name = torch.cuda.get_device_name()
        cc = ".".join(map(str, torch.cuda.get_device_capability()))
        raise RuntimeError(
            f"train.precision=fp8: Transformer Engine reports no fp8 support on {name} "
            f"(compute capability {cc}; fp8 needs 8.9 or newer); use bf16"
        )


class TransformerEngineBackend:
    name = names.TRANSFORMER_ENGINE

    def __init__(self) -> None:
        import transformer_engine  # noqa: F401  (fail early and clearly when it is missing)

        self.device = torch.device("cuda", distributed.from_env().local_rank)

    def transformer_options(self, cfg: PipelineConfig) -> dict[str, Any]:
        t = cfg.train
        if t.precision == "fp8":
            _require_fp8()
        options: dict[str, Any] = dict(
            use_cpu_initialization=cfg.train.init_on_cpu,
            bias_activation_fusion=bias_activation_fusion(cfg),
            bias_dropout_fusion=True,
            masked_softmax_fusion=True,
            persist_layer_norm=True,
            apply_rope_fusion=cfg.model.position_embedding == "rope",
            fused_single_qkv_rope=_compiled_rope(cfg),
            cross_entropy_loss_fusion=True,
            cross_entropy_fusion_impl="te",
            gradient_accumulation_fusion=t.apex and _apex_available(),
            deallocate_pipeline_outputs=True,
        )
        if _tp_comm_overlap(cfg):
            _initialize_userbuffers(cfg)
            options.update(tp_comm_overlap=True)
        if te_activation(cfg):  # TE's activation kernels replace megatron-core's bias fusion
            options.update(use_te_activation_func=True, bias_activation_fusion=False)
        if moe.is_moe(cfg.model):
            options.update(moe_options())
        if t.precision == "fp8":
            options.update(
                fp8="hybrid",
                fp8_recipe=FP8_RECIPES[t.fp8_recipe],
                fp8_amax_history_len=1024,
                fp8_amax_compute_algo="max",
            )
        return options

    def kernels(self, cfg: PipelineConfig) -> str:
        import transformer_engine

        t = cfg.train
        if t.apex and _apex_available():
            wgrad = "apex's fused kernel (megatron-core's gradient-accumulation fusion)"
        elif t.wgrad_fusion:
            apex = "not installed" if t.apex else "off: train.apex=false"
            wgrad = f"Transformer Engine's GEMMs (apex {apex})"
        else:
            wgrad = "a separate add (train.wgrad_fusion=false, no apex)"
        version = getattr(transformer_engine, "__version__", "(version unknown)")
        rope = "; RoPE compiled over the unsplit QKV" if _compiled_rope(cfg) else ""
        experts = ""
        if moe.is_moe(cfg.model):
            o = moe_options()
            fused = [name for name, on in (("permute", o["moe_permute_fusion"]),
                                           ("router", o["moe_router_fusion"])) if on]  # fmt: skip
            experts = "; experts: grouped GEMM, all-to-all dispatch" + (
                f", fused {' and '.join(fused)}" if fused else ""
            )
        return (
            f"Transformer Engine {version}; weight gradients accumulated into fp32 by "
            f"{wgrad}{rope}{experts}"
        )

    def layer_spec(self, cfg: PipelineConfig, config, vp_stage: int | None):
        from megatron.core.extensions.transformer_engine import TENorm
        from megatron.core.models.gpt.gpt_layer_specs import (
            get_gpt_layer_with_transformer_engine_spec,
        )
        from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

        spec = get_gpt_layer_with_transformer_engine_spec(use_te_activation_func=te_activation(cfg))
        if te_activation(cfg):
            spec.submodules.mlp.submodules.activation_func = CheckpointableTEActivation
        if _compiled_rope(cfg):
            from pipeline.model.backends import rope  # torch.compile's machinery, when used

            rope.use_compiled_kernel()
        if not moe.is_moe(cfg.model):
            return spec
        # TE's grouped GEMM runs a rank's experts as one kernel
        expert = get_gpt_layer_with_transformer_engine_spec(
            num_experts=cfg.model.moe.experts,
            moe_grouped_gemm=True,
            use_te_activation_func=te_activation(cfg),
        )
        # a MoE layer's norm before its router is a module of its own; megatron-core's local
        # spec saves it under a dense layer's fused name, its TE spec did not: the same key
        # here, so a MoE checkpoint loads under either backend and exports from either
        keys = expert.submodules.sharded_state_dict_keys_map
        keys["pre_mlp_layernorm."] = "mlp.linear_fc1.layer_norm_"
        if te_activation(cfg):
            mlp = expert.submodules.mlp.submodules
            mlp.experts.submodules.activation_func = CheckpointableTEActivation
            mlp.shared_experts.submodules.activation_func = CheckpointableTEActivation
        return TransformerBlockSubmodules(
            layer_specs=moe.layer_specs(cfg, config, spec, expert, vp_stage), layer_norm=TENorm
        )

    def adapt_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def wrap(self, chunks: list[torch.nn.Module], cfg: PipelineConfig) -> list[torch.nn.Module]:
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.transformer.module import Float16Module

        config = chunks[0].config
        if config.fp16 or config.bf16:
            chunks = [Float16Module(config, c) for c in chunks]
        ddp_config = ddp_settings(cfg, DistributedDataParallelConfig)
        wrapped = [
            DistributedDataParallel(
                config=config, ddp_config=ddp_config, module=c, disable_bucketing=i > 0
            )
            for i, c in enumerate(chunks)
        ]
        for chunk in wrapped:
            chunk.broadcast_params()  # identical weights on every data-parallel rank
        if cfg.train.wgrad_fusion and not config.gradient_accumulation_fusion:
            _fuse_wgrad_accumulation(wrapped)
        no_sync = [c.no_sync for c in wrapped]
        config.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
        config.finalize_model_grads_func = finalize_model_grads
        if ddp_config.overlap_grad_reduce:
            start = [c.start_grad_sync for c in wrapped]
            config.grad_sync_func = start[0] if len(start) == 1 else start
        return wrapped

    def optimizer(self, chunks: list[torch.nn.Module], cfg: PipelineConfig):
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        t = cfg.train
        config = OptimizerConfig(
            optimizer="adam",
            lr=t.lr,
            min_lr=t.min_lr,
            weight_decay=t.weight_decay,
            adam_beta1=t.adam_beta1,
            adam_beta2=t.adam_beta2,
            adam_eps=t.adam_eps,
            clip_grad=t.clip_grad,
            bf16=t.precision in ("bf16", "fp8"),
            fp16=t.precision == "fp16",
            params_dtype=params_dtype(t.precision),
            loss_scale=None,  # fp16: dynamic loss scaling
            initial_loss_scale=2.0**16,
            use_distributed_optimizer=cfg.parallel.distributed_optimizer,
        )
        # how megatron-core's distributed optimizer lays its state out in a checkpoint: gathered
        # into each parameter's shape (any layout loads it), or each rank's shard in place
        sharding = "fully_reshardable" if t.reshardable_optimizer else "dp_reshardable"
        inner = get_megatron_optimizer(config, chunks)
        return _StepAdapter(inner, chunks, t.precision == "fp16", sharding)

    def schedule_context(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def _sharded_state(self, chunks, optimizer, loading: bool, optimizer_format: str) -> dict:
        state = dist_checkpoint.model_state(chunks)
        if optimizer is not None:
            state["optimizer"] = optimizer.inner.sharded_state_dict(
                dict(state),
                is_loading=loading,
                metadata={"distrib_optim_sharding_type": optimizer_format},
            )
        return state

    def save(
        self, folder: Path, chunks: list[torch.nn.Module], optimizer: Any, asynchronous: bool
    ) -> Any | None:
        state = self._sharded_state(chunks, optimizer, False, optimizer.sharding)
        return dist_checkpoint.save(folder, state, asynchronous=asynchronous)

    def load(self, folder: Path, chunks: list[torch.nn.Module], optimizer: Any | None) -> None:
        if optimizer is None:  # the weights alone, from any layout or layer spec
            dist_checkpoint.load_weights(folder, chunks)
            return
        saved = dist_checkpoint.saved_optimizer_format(folder) or optimizer.sharding
        wanted = self._sharded_state(chunks, optimizer, True, saved)
        state = dist_checkpoint.load(folder, wanted)
        for i, chunk in enumerate(chunks):
            key = dist_checkpoint.chunk_key(i, len(chunks))
            dist_checkpoint.unwrap(chunk).load_state_dict(state[key])
        optimizer.inner.load_state_dict(state["optimizer"])


def moe_options() -> dict[str, Any]:
    """How a mixture of experts runs on GPUs, as megatron-core's fastest recipes run it: tokens
    sent to their experts' ranks by all-to-all, each rank's experts as one grouped GEMM, and
    Transformer Engine's fused permutation and top-k router kernels where this TE has them."""
    from megatron.core.transformer.moe import moe_utils

    def available(*names: str) -> bool:  # None (or absent) in TE releases without them
        return all(getattr(moe_utils, name, None) is not None for name in names)

    permute = available(
        "fused_permute",
        "fused_permute_with_probs",
        "fused_sort_chunks_by_index",
        "fused_sort_chunks_by_index_with_probs",
        "fused_unpermute",
    )
    router = available("fused_topk_with_score_function", "fused_compute_score_for_moe_aux_loss")
    return dict(
        moe_token_dispatcher_type="alltoall",
        moe_grouped_gemm=True,
        moe_permute_fusion=permute,
        moe_router_fusion=router,
    )


def te_activation(cfg: PipelineConfig) -> bool:
    """train.te_activation where TE has the activation: its op has SwiGLU and GeLU, not
    squared ReLU (megatron-core's own function runs that)."""
    return cfg.train.te_activation and cfg.model.activation in ("swiglu", "gelu")


def bias_activation_fusion(cfg: PipelineConfig) -> bool:
    """megatron-core's fused bias-activation kernels: bias-GeLU needs a bias, SwiGLU fuses
    without one; squared ReLU has none."""
    m = cfg.model
    return m.activation == "swiglu" or (m.activation == "gelu" and m.add_bias_linear)


class CheckpointableTEActivation:
    """Transformer Engine's activation op (SwiGLU, GeLU) as megatron-core builds it, plus the
    sharded_state_dict that megatron-core 0.16.1's MLP asks each submodule for and TE's op
    lacks: its state (fp8 scaling, if any) saved as replicated, as for any plain module."""

    def __new__(cls, config):
        from megatron.core.extensions.transformer_engine import TEActivationOp
        from megatron.core.transformer.utils import (
            ensure_metadata_has_dp_cp_group,
            make_sharded_tensors_for_checkpoint,
        )

        layer = TEActivationOp(config)

        def sharded_state_dict(prefix="", sharded_offsets=(), metadata=None) -> dict:
            metadata = ensure_metadata_has_dp_cp_group(metadata)
            state = layer.state_dict(prefix="", keep_vars=True)
            return make_sharded_tensors_for_checkpoint(
                state, prefix, {}, sharded_offsets, dp_cp_group=metadata["dp_cp_group"]
            )

        layer.sharded_state_dict = sharded_state_dict
        return layer


def _tp_comm_overlap(cfg: PipelineConfig) -> bool:
    """parallel.tp_comm_overlap where it can act: tensor-parallel ranks, sequence parallel."""
    p = cfg.parallel
    return bool(p.tp_comm_overlap and settled(cfg).tensor > 1 and p.sequence_parallel)


_USERBUFFERS: list[bool] = []  # Transformer Engine's userbuffers are made once per process


def _initialize_userbuffers(cfg: PipelineConfig) -> None:
    """Transformer Engine's userbuffers for the tensor-parallel all-gathers and reduce-scatters
    its GEMMs overlap (one [tokens of a micro-batch, hidden] buffer per collective), set up
    over the NCCL process group as Megatron-LM does."""
    if _USERBUFFERS:
        return
    from transformer_engine.pytorch.module.base import initialize_ub

    t, m, s = cfg.train, cfg.model, settled(cfg)
    initialize_ub(
        shape=[m.seq_length * s.micro_batch_size, m.hidden_size],
        tp_size=s.tensor,
        use_fp8=t.precision == "fp8",
        dtype=params_dtype(t.precision),
        bootstrap_backend="nccl",
    )
    _USERBUFFERS.append(True)


def ddp_settings(cfg: PipelineConfig, config_class):
    """megatron-core's DistributedDataParallelConfig for the run. The overlaps only where there
    are data-parallel peers: on one rank megatron-core would still hook every parameter and
    module and call NCCL on a group of one, so one GPU trains exactly as without them."""
    p = cfg.parallel
    peers = data_parallel_size(cfg) > 1
    return config_class(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=p.overlap_grad_reduce and peers,
        overlap_param_gather=p.overlap_param_gather and p.distributed_optimizer and peers,
        use_distributed_optimizer=p.distributed_optimizer,
        bucket_size=p.ddp_bucket_size,
    )


def _fuse_wgrad_accumulation(chunks: list[torch.nn.Module]) -> None:
    """Let Transformer Engine's layers add their weight gradients straight into the fp32 main
    gradients that DistributedDataParallel allocated (one GEMM, no bf16 copy and no separate
    add). megatron-core enables this only with apex, which its own output layer needs; TE's
    layers do it themselves, so switch them alone, now that main_grad exists."""
    for chunk in chunks:
        for module in chunk.modules():
            weights = [p for n, p in module.named_parameters(recurse=False) if "weight" in n]
            if (
                hasattr(module, "fuse_wgrad_accumulation")
                and weights
                and all(hasattr(w, "main_grad") for w in weights)
            ):
                module.fuse_wgrad_accumulation = True


def _grads_finite(chunks: list[torch.nn.Module]) -> bool:
    """No NaN or inf in this rank's gradients (megatron-core's DDP keeps them in main_grad)."""
    grads = [
        p.main_grad if hasattr(p, "main_grad") else p.grad
        for chunk in chunks
        for p in chunk.parameters()
    ]
    grads = [g for g in grads if g is not None]
    # one fused pass (foreach kernels) instead of a check per tensor: this runs every step
    return not grads or bool(torch.isfinite(torch.nn.utils.get_total_norm(grads)))


class _StepAdapter:
    """megatron-core's optimizer under the contract the loop uses: step() -> (updated, norm).
    A step whose gradient is not finite on any rank is skipped by every rank: megatron-core's
    bf16 and fp32 optimizers would apply it (only fp16 loss scaling checks, and lowers its
    scale, so fp16 is left to it)."""

    def __init__(self, inner, chunks: list[torch.nn.Module], fp16: bool, sharding: str) -> None:
        self.inner = inner
        self.chunks = chunks
        self.fp16 = fp16
        self.sharding = sharding  # megatron-core's distrib_optim_sharding_type for saves

    @property
    def param_groups(self) -> list[dict]:
        return self.inner.param_groups

    def zero_grad(self) -> None:
        self.inner.zero_grad()

    def sync_params(self) -> None:
        """Finish the weights' all-gather now, not in the next forward, where
        parallel.overlap_param_gather leaves it: a checkpoint reads the weights."""
        for chunk in self.chunks:
            if chunk.ddp_config.overlap_param_gather:
                chunk.start_param_sync(force_sync=True)

    def reload_model_params(self) -> None:
        """Copy weights loaded into the model into the optimizer's fp32 main copy."""
        self.inner.reload_model_params()

    def step(self) -> tuple[bool, float]:
        device = next(self.chunks[0].parameters()).device
        if not self.fp16 and distributed.any_rank(not _grads_finite(self.chunks), device):
            return False, float("nan")
        updated, grad_norm, _ = self.inner.step()
        return bool(updated), float(grad_norm) if grad_norm is not None else float("nan")

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)
