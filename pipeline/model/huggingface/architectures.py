"""Which transformers model a config is, and the config.json that says so.

A Llama-shaped model (RMSNorm, SwiGLU, rotary positions) is `LlamaForCausalLM`, with grouped
query attention, tied or untied embeddings and optional biases; a GPT-2-shaped one (LayerNorm,
GELU, learned positions) is `GPT2LMHeadModel`. Any other mix has no transformers class that
computes the same function, and is refused naming the part.

A Llama-shaped mixture of experts is `MixtralForCausalLM`: every layer's MLP a set of SwiGLU
experts, a softmax router whose top-k weights are renormalised to sum to one (megatron-core's
softmax over the top-k logits is the same function). What Mixtral lacks is refused naming the
key: a shared expert (megatron-core's has no gate; Qwen2-MoE's always has one), dense first
layers, token dropping (capacity_factor, which drops tokens at evaluation too), the sigmoid
router of aux-loss-free balancing, top_k=1 (megatron-core then takes the softmax over all
experts, Mixtral gives the one expert weight 1) and linear biases.
"""

from __future__ import annotations

from typing import Any, NoReturn

from pipeline.config import ModelConfig
from pipeline.core.errors import ConfigError
from pipeline.model.moe import is_moe
from pipeline.model.sizes import ffn_hidden_size

LLAMA = "LlamaForCausalLM"
GPT2 = "GPT2LMHeadModel"
MIXTRAL = "MixtralForCausalLM"
NORM_EPS = 1e-5  # megatron-core's layernorm_epsilon, which the pipeline leaves at its default

# (key, value) of each shape: a model is the shape whose every part it has
SHAPES = {
    LLAMA: (("normalization", "RMSNorm"), ("activation", "swiglu"), ("position_embedding", "rope")),
    GPT2: (
        ("normalization", "LayerNorm"),
        ("activation", "gelu"),
        ("position_embedding", "learned_absolute"),
    ),
}


def architecture(model: ModelConfig) -> str:
    """LLAMA, GPT2 or MIXTRAL, or ConfigError naming the part of `model` that none has."""
    for name, parts in SHAPES.items():
        if all(getattr(model, key) == value for key, value in parts):
            if is_moe(model):
                return _mixtral(model, name)
            if name == GPT2 and (model.num_query_groups or model.num_attention_heads) != (
                model.num_attention_heads
            ):
                raise ConfigError(
                    f"model.num_query_groups={model.num_query_groups}: GPT2LMHeadModel has no "
                    "grouped-query attention, so this model has no transformers equivalent"
                )
            return name
    # the shape it is nearer to names what stands in the way
    nearest = max(SHAPES, key=lambda n: sum(getattr(model, k) == v for k, v in SHAPES[n]))
    key, value = next((k, v) for k, v in SHAPES[nearest] if getattr(model, k) != v)
    _refuse(model, nearest, key, value)


def _mixtral(model: ModelConfig, shape: str) -> str:
    """MIXTRAL for a Llama-shaped mixture of experts that Mixtral computes, else ConfigError."""
    if shape != LLAMA:
        raise ConfigError(
            f"model.moe.experts={model.moe.experts}: a mixture of experts is exported as "
            f"{MIXTRAL}, which is Llama-shaped; this model is {shape}-shaped"
        )
    why = moe_refusal(model)
    if why:
        raise ConfigError(why)
    return MIXTRAL


def moe_refusal(model: ModelConfig) -> str | None:
    """Why MixtralForCausalLM does not compute this mixture of experts, naming the key; None
    when it does."""
    moe = model.moe
    if moe.shared_expert_ffn_hidden_size:
        return (
            f"model.moe.shared_expert_ffn_hidden_size={moe.shared_expert_ffn_hidden_size}: "
            f"{MIXTRAL} has no shared expert, and Qwen2MoeForCausalLM's is gated, which "
            "megatron-core's is not: no transformers model computes this one"
        )
    if moe.first_dense_layers:
        return (
            f"model.moe.first_dense_layers={moe.first_dense_layers}: {MIXTRAL} has experts in "
            "every layer; export needs model.moe.first_dense_layers=0"
        )
    if moe.capacity_factor is not None:
        return (
            f"model.moe.capacity_factor={moe.capacity_factor}: megatron-core drops tokens over "
            f"capacity even at evaluation, {MIXTRAL} never does; export needs it null (dropless)"
        )
    if moe.router == "aux_loss_free":
        return (
            f"model.moe.router=aux_loss_free: its sigmoid router with expert biases is not "
            f"{MIXTRAL}'s softmax router"
        )
    if moe.top_k == 1:
        return (
            f"model.moe.top_k=1: megatron-core weighs the one expert by its softmax over all "
            f"experts, {MIXTRAL} by 1; export needs model.moe.top_k of 2 or more"
        )
    if model.add_bias_linear:
        return f"model.add_bias_linear=true: {MIXTRAL} has no linear biases"
    return None


def expert_ffn_hidden_size(model: ModelConfig) -> int:
    return model.moe.ffn_hidden_size or ffn_hidden_size(model)


def _refuse(model: ModelConfig, nearest: str, key: str, value: str) -> NoReturn:
    parts = ", ".join(f"{k}={v}" for k, v in SHAPES[nearest])
    raise ConfigError(
        f"model.{key}={getattr(model, key)}: no transformers model computes this one; "
        f"{nearest} needs {parts} (this model differs in model.{key}, which it needs as {value})"
    )


def head_dim(model: ModelConfig) -> int:
    return model.hidden_size // model.num_attention_heads


def hf_config(
    model: ModelConfig, vocab_size: int, special: dict[str, int], dtype: str, exact_gelu: bool
) -> dict[str, Any]:
    """config.json of the exported model. `special`: bos/eos token ids; `dtype`: the weights'
    torch dtype name; `exact_gelu`: GELU as erf (the CPU backend) rather than the tanh
    approximation that Transformer Engine's and megatron-core's fused GELU compute."""
    name = architecture(model)
    common = {
        "architectures": [name],
        "vocab_size": vocab_size,
        "tie_word_embeddings": not model.untie_embeddings,
        "initializer_range": model.init_method_std,
        "bos_token_id": special["bos"],
        "eos_token_id": special["eos"],
        "dtype": dtype,
        "torch_dtype": dtype,  # the name transformers before 4.56 reads
        "use_cache": True,
    }
    positions = model.max_position_embeddings or model.seq_length
    if name == MIXTRAL:
        return {
            **common,
            **_llama_attention(model, positions),
            "model_type": "mixtral",
            "intermediate_size": expert_ffn_hidden_size(model),
            "num_local_experts": model.moe.experts,
            "num_experts_per_tok": model.moe.top_k,
            "router_aux_loss_coef": model.moe.aux_loss_coeff,
            "router_jitter_noise": 0.0,
            "output_router_logits": False,
            "sliding_window": None,
        }
    if name == LLAMA:
        return {
            **common,
            **_llama_attention(model, positions),
            "model_type": "llama",
            "intermediate_size": ffn_hidden_size(model),
            "mlp_bias": model.add_bias_linear,
            "pretraining_tp": 1,
        }
    return {
        **common,
        "model_type": "gpt2",
        "n_embd": model.hidden_size,
        "n_inner": ffn_hidden_size(model),
        "n_layer": model.num_layers,
        "n_head": model.num_attention_heads,
        "n_positions": positions,
        "n_ctx": positions,
        "activation_function": "gelu" if exact_gelu else "gelu_new",
        "layer_norm_epsilon": NORM_EPS,
        "resid_pdrop": model.hidden_dropout,
        "embd_pdrop": model.hidden_dropout,
        "attn_pdrop": model.attention_dropout,
        "scale_attn_weights": True,
    }


def _llama_attention(model: ModelConfig, positions: int) -> dict[str, Any]:
    """The config.json entries that Llama and Mixtral share: all but the MLP's."""
    return {
        "hidden_size": model.hidden_size,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.num_query_groups or model.num_attention_heads,
        "head_dim": head_dim(model),
        "hidden_act": "silu",
        "max_position_embeddings": positions,
        "rms_norm_eps": NORM_EPS,
        "rope_theta": float(model.rotary_base),
        "rope_parameters": {"rope_type": "default", "rope_theta": float(model.rotary_base)},
        "attention_bias": model.add_bias_linear,
        "attention_dropout": model.attention_dropout,
    }


def llama_settings(hf: dict[str, Any]) -> dict[str, Any]:
    """The model.* values a Hugging Face Llama config.json stands for (its rope scaling, if
    any, is refused: the pipeline's rotary embedding has none)."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        raise ConfigError(
            f"model.init_from: its rope scaling {rope.get('rope_type', rope.get('type'))!r} "
            "has no equivalent here (model.rotary_base alone)"
        )
    heads = hf["num_attention_heads"]
    hidden = hf["hidden_size"]
    if hf.get("head_dim") not in (None, hidden // heads):
        raise ConfigError(
            f"model.init_from: head_dim {hf['head_dim']} is not hidden_size / "
            f"num_attention_heads ({hidden // heads}), which megatron-core's attention assumes"
        )
    if hf.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"model.init_from: hidden_act {hf['hidden_act']!r} is not SwiGLU's silu")
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    return {
        "num_layers": hf["num_hidden_layers"],
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_query_groups": hf.get("num_key_value_heads") or heads,
        "ffn_hidden_size": hf["intermediate_size"],
        "activation": "swiglu",
        "normalization": "RMSNorm",
        "position_embedding": "rope",
        "rotary_base": int(theta) if float(theta).is_integer() else theta,
        "untie_embeddings": not hf.get("tie_word_embeddings", False),
        "add_bias_linear": bool(hf.get("attention_bias", False)),
    }


def mixtral_settings(hf: dict[str, Any]) -> dict[str, Any]:
    """The model.* values a Hugging Face Mixtral config.json stands for: its attention's as a
    Llama's, its experts' as model.moe.experts, model.moe.top_k and model.moe.ffn_hidden_size
    (a sliding window, which the pipeline's attention lacks, is refused)."""
    if hf.get("sliding_window") is not None:
        raise ConfigError(
            f"model.init_from: its sliding_window {hf['sliding_window']} has no equivalent "
            "here (attention over the whole sequence)"
        )
    settings = llama_settings(hf)
    del settings["ffn_hidden_size"]  # Mixtral's intermediate_size is each expert's width
    return {
        **settings,
        "moe.experts": hf.get("num_local_experts", 8),
        "moe.top_k": hf.get("num_experts_per_tok", 2),
        "moe.ffn_hidden_size": hf["intermediate_size"],
        "moe.first_dense_layers": 0,  # experts in every layer
        "moe.shared_expert_ffn_hidden_size": 0,
        "moe.capacity_factor": None,  # dropless
    }


def mismatch(model: ModelConfig, hf: dict[str, Any]) -> str | None:
    """The first model.* setting that differs from the Llama or Mixtral of `hf` (config.json),
    as 'model.KEY is X, the checkpoint's is Y', or why Mixtral does not compute this model;
    None when the model is that Llama or Mixtral."""
    if _is(hf, "mixtral", MIXTRAL):
        wanted = mixtral_settings(hf)
    elif _is(hf, "llama", LLAMA):
        if bool(hf.get("attention_bias", False)) != bool(hf.get("mlp_bias", False)):
            return "its attention and MLP biases differ (attention_bias, mlp_bias): model.add_bias_linear is one switch"
        wanted = {**llama_settings(hf), "moe.experts": 0}
    else:
        kind = hf.get("model_type") or hf.get("architectures")
        return f"it is a {kind} model, not a Llama or Mixtral"
    for key, value in wanted.items():
        have = _setting(model, key)
        if have != value:
            return f"model.{key} is {have}, the checkpoint's is {value}"
    return moe_refusal(model) if is_moe(model) else None


def _is(hf: dict[str, Any], model_type: str, name: str) -> bool:
    return hf.get("model_type") == model_type or name in hf.get("architectures", [])


def _setting(model: ModelConfig, key: str) -> Any:
    """model.KEY as the checkpoint's config.json would state it (defaults resolved)."""
    if key == "num_query_groups":
        return model.num_query_groups or model.num_attention_heads
    if key == "ffn_hidden_size":
        return ffn_hidden_size(model)
    if key == "moe.ffn_hidden_size":
        return expert_ffn_hidden_size(model)
    if key.startswith("moe."):
        return getattr(model.moe, key.removeprefix("moe."))
    return getattr(model, key)
