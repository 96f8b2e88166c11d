"""The CPU backend: megatron-core's local layer spec with torch's attention, rotary embeddings
kept on the CPU, torch AdamW over gloo, checkpoints in megatron-core's distributed format."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from pipeline.config import PipelineConfig, TrainConfig
from pipeline.config.derived import settled
from pipeline.model import dist_checkpoint, moe
from pipeline.model.backends import names
from pipeline.runtime.device import cuda_allocations_on_cpu, cuda_calls_on_cpu


class SDPAttention(torch.nn.Module):
    """Core attention through torch's scaled_dot_product_attention, which runs anywhere; it
    replaces megatron-core's DotProductAttention, whose buffers live on CUDA."""

    def __init__(
        self,
        config,
        layer_number,
        attn_mask_type,
        attention_type,
        attention_dropout=None,
        softmax_scale=None,
        cp_comm_type=None,
        pg_collection=None,
    ):
        super().__init__()
        self.config = config
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.scale = softmax_scale

    def forward(
        self,
        query,
        key,
        value,
        attention_mask,
        attn_mask_type=None,
        attention_bias=None,
        packed_seq_params=None,
    ):
        # megatron-core passes [seq, batch, heads, dim]; SDPA wants [batch, heads, seq, dim]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        if k.shape[1] != q.shape[1]:  # grouped-query attention: share each key/value head
            repeat = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        mask = None if attention_mask is None else ~attention_mask  # megatron: True = masked
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=mask is None,
            dropout_p=self.dropout if self.training else 0.0,
            scale=self.scale,
        )
        b, h, s, d = out.shape
        return out.permute(2, 0, 1, 3).reshape(s, b, h * d)


def _cpu_rotary_class():
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    class CpuRotaryEmbedding(RotaryEmbedding):
        """RotaryEmbedding.get_emb moves its frequencies to the CUDA device; here they stay."""

        def get_emb(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
            freqs = self.get_freqs_non_repeated(max_seq_len, offset)
            if self.rotary_interleaved:
                emb = torch.stack((freqs.view(-1, 1), freqs.view(-1, 1)), dim=-1)
                emb = emb.view(freqs.shape[0], -1)
            else:
                emb = torch.cat((freqs, freqs), dim=-1)
            return emb[:, None, None, :]

    return CpuRotaryEmbedding


def _seeded_layer_class():
    from megatron.core import parallel_state
    from megatron.core.transformer.transformer_layer import (
        TransformerLayer,
        get_transformer_layer_offset,
    )

    class SeededTransformerLayer(TransformerLayer):
        """A transformer layer whose weights are drawn from the run's seed and the layer's
        place in the whole model, so a pipeline stage builds the same layers as one process
        does: the initial model is the same under every layout (tensor-parallel shards are
        cut from whole weights already, with use_cpu_initialization)."""

        def __init__(self, config, submodules, layer_number: int = 1, *args, seed: int, **kw):
            pipeline_rank = parallel_state.get_pipeline_model_parallel_rank()
            offset = get_transformer_layer_offset(config, kw.get("vp_stage"), pipeline_rank)
            torch.manual_seed(seed * 100_003 + offset + layer_number)
            with _cuda_on_cpu():  # a MoE router's counters are made "on the current device"
                super().__init__(config, submodules, layer_number, *args, **kw)

        def forward(self, *args, **kwargs):
            if not self.is_moe_layer:
                return super().forward(*args, **kwargs)
            # megatron-core's router moves its weight to the current CUDA device, and its
            # dispatcher makes tensors there: on the CPU in every forward (evaluation and
            # generation too, which run outside the training schedule's context)
            with _cuda_on_cpu():
                return super().forward(*args, **kwargs)

    return SeededTransformerLayer


def _cuda_on_cpu() -> contextlib.AbstractContextManager:
    stack = contextlib.ExitStack()
    stack.enter_context(cuda_allocations_on_cpu())
    stack.enter_context(cuda_calls_on_cpu())
    return stack


def _seeded_experts_class():
    from megatron.core.transformer.mlp import MLP
    from megatron.core.transformer.moe.experts import SequentialMLP

    class SeededSequentialMLP(SequentialMLP):
        """This rank's experts, each drawn from the layer's seed and the expert's number in the
        whole layer, so that expert 5 is the same expert under every expert-parallel size; the
        modules built after them (a shared expert) draw from a seed of their own likewise."""

        def __init__(self, num_local_experts, config, submodules, pg_collection=None):
            layer_seed = torch.initial_seed()  # SeededTransformerLayer's, for this layer
            super().__init__(0, config, submodules, pg_collection)
            self.num_local_experts = num_local_experts
            first = pg_collection.ep.rank() * num_local_experts
            for index in range(first, first + num_local_experts):
                torch.manual_seed(_expert_seed(layer_seed, index))
                expert = MLP(
                    self.config,
                    submodules,
                    ffn_hidden_size=self.config.moe_ffn_hidden_size,
                    is_expert=True,
                    tp_group=pg_collection.expt_tp,
                )
                self.local_experts.append(expert)
            torch.manual_seed(_expert_seed(layer_seed, config.num_moe_experts))

    return SeededSequentialMLP


def _expert_seed(layer_seed: int, index: int) -> int:
    return (layer_seed * 1_000_003 + index + 1) % 2**63


class DataParallelAdamW:
    """torch AdamW over this rank's shard of the model: averages gradients across the
    data-parallel group (gloo), clips them by the whole model's norm, and skips a step whose
    gradient is not finite. Same contract as megatron-core's optimizers: step() -> (updated,
    grad_norm).

    Under expert parallelism a rank holds some of the experts, which saw tokens of every rank
    of its expert-parallel group: their gradients are summed over the ranks holding the same
    experts and divided by the whole data-parallel size, as megatron-core's DDP does."""

    def __init__(self, chunks: list[torch.nn.Module], t: TrainConfig):
        from megatron.core import parallel_state

        self.chunks = chunks
        self.params = [p for c in chunks for p in c.parameters() if p.requires_grad]
        # megatron-core marks expert weights split over expert-parallel ranks allreduce=False
        self.expert = [not getattr(p, "allreduce", True) for p in self.params]
        decay = [p for p in self.params if p.ndim >= 2]
        no_decay = [p for p in self.params if p.ndim < 2]  # norms and biases
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "wd_mult": 1.0}, {"params": no_decay, "wd_mult": 0.0}],
            lr=t.lr,
            betas=(t.adam_beta1, t.adam_beta2),
            eps=t.adam_eps,
            weight_decay=t.weight_decay,
        )
        self.clip = t.clip_grad
        self.dp_group = parallel_state.get_data_parallel_group()
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.mp_group = parallel_state.get_model_parallel_group()
        if any(self.expert):
            self.expert_dp_group = parallel_state.get_expert_data_parallel_group()
            self.expert_mp_group = parallel_state.get_expert_tensor_model_pipeline_parallel_group()

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def reload_model_params(self) -> None:
        """Nothing to do: AdamW updates the model's own fp32 parameters."""

    def step(self) -> tuple[bool, float]:
        moe.update_expert_bias(self.chunks)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        self._average([g for g, e in zip(grads, self.expert, strict=True) if not e], False)
        self._average([g for g, e in zip(grads, self.expert, strict=True) if e], True)
        for p, g in zip(self.params, grads, strict=True):
            p.grad = g.view_as(p)
        norm = self._grad_norm()
        if not math.isfinite(norm):
            return False, norm
        if self.clip:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.clip, torch.tensor(norm))
        self.optimizer.step()
        return True, norm

    def _average(self, grads: list[torch.Tensor], experts: bool) -> None:
        """Sum `grads` (in place) over the ranks holding the same weights, over the job's
        data-parallel size."""
        if not grads or self.dp_size == 1:
            return
        group = self.expert_dp_group if experts else self.dp_group
        flat = torch.cat([g.reshape(-1) for g in grads])
        if torch.distributed.get_world_size(group) > 1:
            torch.distributed.all_reduce(flat, group=group)
        flat /= self.dp_size
        for g, averaged in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
            g.copy_(averaged.view_as(g))

    def _grad_norm(self) -> float:
        """The norm of the whole model's gradient: each tensor-parallel shard once, a weight
        copied on every tensor-parallel rank (norms, biases) once, all pipeline stages, and
        each expert once over the expert-parallel ranks."""
        dense = self._squared_norm([not e for e in self.expert], self.mp_group)
        if not any(self.expert):
            return float(dense.sqrt())
        return float((dense + self._squared_norm(self.expert, self.expert_mp_group)).sqrt())

    def _squared_norm(self, chosen: list[bool], group) -> torch.Tensor:
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        own = [
            p.grad
            for p, c in zip(self.params, chosen, strict=True)
            if c and param_is_not_tensor_parallel_duplicate(p)
        ]
        zero = torch.zeros((), dtype=torch.float64)
        squared = torch.nn.utils.get_total_norm(own).double() ** 2 if own else zero
        if torch.distributed.get_world_size(group) > 1:
            torch.distributed.all_reduce(squared, group=group)
        return squared

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)

    def sharded_state_dict(self, model_state: dict, loading: bool) -> dict:
        """The moments of each parameter sharded as the parameter is (megatron-core's
        distributed checkpoint format), so they load under any tensor, pipeline or
        data-parallel layout; hyperparameters and the step count are common to all ranks.
        Loading, the moments are placeholders for what the checkpoint holds."""
        from megatron.core.dist_checkpointing.optimizer import (
            get_param_id_to_sharded_param_map,
            optim_state_to_sharding_state,
        )

        state = self.optimizer.state_dict()
        if loading or not state["state"]:  # no step taken yet: zero moments, step 0
            state["state"] = {
                i: {
                    "step": torch.tensor(0.0),
                    "exp_avg": torch.zeros_like(p),
                    "exp_avg_sq": torch.zeros_like(p),
                }
                for i, p in enumerate(self._in_state_order())
            }
        steps = {float(s["step"]) for s in state["state"].values()}
        if len(steps) != 1:  # every parameter has a gradient (zeros if unused) at every step
            raise RuntimeError(f"AdamW parameters at different step counts: {sorted(steps)}")
        by_id = get_param_id_to_sharded_param_map(model_state, self._in_state_order())
        optim_state_to_sharding_state(state, by_id, exclude_keys=("step",))
        state["adam_step"] = steps.pop()
        return state

    def load_sharded(self, loaded: dict) -> None:
        """What sharded_state_dict asked for, read back: the step count given to every
        parameter again."""
        step = loaded.pop("adam_step")
        for moments in loaded["state"].values():
            moments["step"] = torch.tensor(step)
        self.optimizer.load_state_dict(loaded)

    def _in_state_order(self) -> list[torch.nn.Parameter]:
        """The parameters in the order torch numbers them in its state dict."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]


class CpuBackend:
    name = names.CPU
    device = torch.device("cpu")

    def kernels(self, cfg: PipelineConfig) -> str:
        experts = "; experts: allgather dispatch, one MLP each" if moe.is_moe(cfg.model) else ""
        return "megatron-core's local layers on the CPU" + experts

    def transformer_options(self, cfg: PipelineConfig) -> dict[str, Any]:
        if cfg.train.precision != "fp32":
            raise ValueError(f"train.precision={cfg.train.precision} needs a GPU; use fp32 on CPU")
        if settled(cfg).pipeline > 1 and not cfg.model.untie_embeddings:
            # megatron-core moves the output layer's copy of a tied embedding to CUDA
            raise ValueError("parallel.pipeline>1 on CPU needs model.untie_embeddings=true")
        moe.use_torch_router_gemm()
        # the dispatcher that runs without CUDA (alltoall asks for CUDA streams)
        dispatcher = dict(moe_token_dispatcher_type="allgather") if moe.is_moe(cfg.model) else {}
        return dict(
            **dispatcher,
            use_cpu_initialization=True,
            perform_initialization=True,
            bias_activation_fusion=False,
            bias_dropout_fusion=False,
            masked_softmax_fusion=False,
            persist_layer_norm=False,
            gradient_accumulation_fusion=False,
            apply_rope_fusion=False,
            cross_entropy_loss_fusion=False,
        )

    def layer_spec(self, cfg: PipelineConfig, config, vp_stage: int | None):
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer.torch_norm import WrappedTorchNorm
        from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

        m = cfg.model
        dense = get_gpt_layer_local_spec(normalization=m.normalization)
        expert = get_gpt_layer_local_spec(num_experts=m.moe.experts, normalization=m.normalization)
        if moe.is_moe(m):
            expert.submodules.mlp.submodules.experts.module = _seeded_experts_class()
        for layer in (dense, expert):
            layer.submodules.self_attention.submodules.core_attention = SDPAttention
            layer.module, layer.params = _seeded_layer_class(), {"seed": cfg.train.seed}
        # the final norm too: given a layer spec, megatron-core takes Transformer Engine's
        # whenever TE is importable (as on a GPU host running a CPU job), and TE's needs CUDA
        return TransformerBlockSubmodules(
            layer_specs=moe.layer_specs(cfg, config, dense, expert, vp_stage),
            layer_norm=WrappedTorchNorm,
        )

    def adapt_model(self, model: torch.nn.Module) -> torch.nn.Module:
        rotary = getattr(model, "rotary_pos_emb", None)
        if rotary is not None and type(rotary).__name__ == "RotaryEmbedding":
            rotary.__class__ = _cpu_rotary_class()
        return model

    def wrap(self, chunks: list[torch.nn.Module], cfg: PipelineConfig) -> list[torch.nn.Module]:
        return chunks  # gradients are averaged by the optimizer

    def optimizer(self, chunks: list[torch.nn.Module], cfg: PipelineConfig) -> DataParallelAdamW:
        return DataParallelAdamW(chunks, cfg.train)

    def schedule_context(self) -> contextlib.AbstractContextManager:
        return _cuda_on_cpu()  # pipeline stages send and receive over gloo

    def _sharded_state(self, chunks, optimizer, loading: bool) -> dict:
        state = dist_checkpoint.model_state(chunks)
        if optimizer is not None:
            state["optimizer"] = optimizer.sharded_state_dict(dict(state), loading)
        return state

    def save(
        self, folder: Path, chunks: list[torch.nn.Module], optimizer: Any, asynchronous: bool
    ) -> Any | None:
        state = self._sharded_state(chunks, optimizer, False)
        return dist_checkpoint.save(folder, state, on_cpu=True, asynchronous=asynchronous)

    def load(self, folder: Path, chunks: list[torch.nn.Module], optimizer: Any | None) -> None:
        dist_checkpoint.load_weights(folder, chunks)
        if optimizer is None:
            return
        if any(folder.glob("optimizer_tp*_pp*.pt")):  # written by 0.2: one file per model shard
            state = torch.load(folder / _optimizer_file(), map_location="cpu", weights_only=False)
            optimizer.load_state_dict(state)
            return
        wanted = {
            "optimizer": optimizer.sharded_state_dict(dist_checkpoint.model_state(chunks), True)
        }
        optimizer.load_sharded(dist_checkpoint.load(folder, wanted)["optimizer"])


def _optimizer_file() -> str:
    """This rank's optimizer file in a checkpoint of 0.2, named by its tensor- and
    pipeline-parallel rank."""
    from megatron.core import parallel_state as ps

    tp, pp = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
    return f"optimizer_tp{tp:02d}_pp{pp:02d}.pt"
