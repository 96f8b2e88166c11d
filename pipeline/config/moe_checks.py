"""The checks of a mixture of experts (the MoE keys of the model and parallel sections): keys
that cannot take effect together, each refused in one line naming the key before anything
runs."""

from __future__ import annotations

from pipeline.config import derived
from pipeline.config.schema import AUTO, MoeConfig, PipelineConfig
from pipeline.core.errors import ConfigError


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def check_moe(cfg: PipelineConfig) -> None:
    m, p = cfg.model, cfg.parallel
    moe = m.moe
    if not moe.experts:
        _check_dense(cfg)
        return
    _require(
        moe.top_k <= moe.experts,
        "model.moe.top_k",
        f"{moe.top_k} exceeds model.moe.experts={moe.experts}",
    )
    _require(
        moe.first_dense_layers < m.num_layers,
        "model.moe.first_dense_layers",
        f"{moe.first_dense_layers} leaves no MoE layer among model.num_layers={m.num_layers}",
    )
    _require(
        moe.router != "aux_loss_free" or moe.aux_loss_coeff == _default("aux_loss_coeff"),
        "model.moe.aux_loss_coeff",
        "set, but model.moe.router=aux_loss_free balances without a loss; use "
        "model.moe.router=aux_loss or seq_aux_loss to weigh one",
    )
    _require(
        moe.experts % p.expert == 0,
        "parallel.expert",
        f"{p.expert} does not divide model.moe.experts={moe.experts}",
    )
    expert_tensor = p.expert_tensor or p.tensor
    _require(
        not m.add_bias_linear or expert_tensor == 1,
        "model.add_bias_linear",
        f"biases in experts need expert-tensor-parallel size 1 (it is {expert_tensor}); set "
        "parallel.expert_tensor=1",
    )
    if AUTO in (p.tensor, p.pipeline):
        return  # the planner chooses them, then the config is checked again
    data_parallel = derived.data_parallel_size(cfg) * p.context
    _require(
        data_parallel % p.expert == 0,
        "parallel.expert",
        f"{p.expert} does not divide the data-parallel size {data_parallel} (ranks / (tensor x "
        "pipeline)): experts are shared out among data-parallel ranks",
    )
    ws = derived.world_size(cfg.cluster)
    expert_ranks = expert_tensor * p.expert * p.pipeline
    _require(
        ws % expert_ranks == 0,
        "parallel.expert_tensor",
        f"expert_tensor x expert x pipeline = {expert_ranks} does not divide the job's {ws} ranks",
    )


# what only a mixture of experts reads
MOE_ONLY = (
    "model.moe.top_k",
    "model.moe.ffn_hidden_size",
    "model.moe.shared_expert_ffn_hidden_size",
    "model.moe.router",
    "model.moe.aux_loss_coeff",
    "model.moe.z_loss_coeff",
    "model.moe.capacity_factor",
    "model.moe.first_dense_layers",
)


def _check_dense(cfg: PipelineConfig) -> None:
    """A dense model (model.moe.experts=0) reads no other MoE key: one given is a mistake."""
    for key in MOE_ONLY:
        name = key.rsplit(".", 1)[1]
        if getattr(cfg.model.moe, name) != _default(name):
            raise ConfigError(
                f"{key}: set, but model.moe.experts=0 (a dense model); set "
                "model.moe.experts to build a mixture of experts"
            )
    p = cfg.parallel
    for key, value, default in (("expert", p.expert, 1), ("expert_tensor", p.expert_tensor, None)):
        _require(
            value == default,
            f"parallel.{key}",
            f"{value} needs a mixture of experts (model.moe.experts > 0)",
        )


def _default(name: str):
    return MoeConfig.__dataclass_fields__[name].default
