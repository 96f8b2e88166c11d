"""Which transformers model a config is, and the config.json that says so.

A Llama-shaped model (RMSNorm, SwiGLU, rotary positions) is `LlamaForCausalLM`, with grouped
query attention, tied or untied embeddings and optional biases; a GPT-2-shaped one (LayerNorm,
GELU, learned positions) is `GPT2LMHeadModel`. Any other mix has no transformers class that
computes the same function, and is refused naming the part.
"""

from __future__ import annotations

from typing import Any, NoReturn

from pipeline.config import ModelConfig
from pipeline.core.errors import ConfigError
from pipeline.model.sizes import ffn_hidden_size

LLAMA = "LlamaForCausalLM"
GPT2 = "GPT2LMHeadModel"
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
    """LLAMA or GPT2, or ConfigError naming the part of `model` that neither has."""
    for name, parts in SHAPES.items():
        if all(getattr(model, key) == value for key, value in parts):
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
    if name == LLAMA:
        return {
            **common,
            "model_type": "llama",
            "hidden_size": model.hidden_size,
            "intermediate_size": ffn_hidden_size(model),
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
            "mlp_bias": model.add_bias_linear,
            "attention_dropout": model.attention_dropout,
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


def mismatch(model: ModelConfig, hf: dict[str, Any]) -> str | None:
    """The first model.* setting that differs from the Llama of `hf` (config.json), as
    'model.KEY is X, the checkpoint's is Y', or None when the model is that Llama."""
    if hf.get("model_type") != "llama" and LLAMA not in hf.get("architectures", []):
        return f"it is a {hf.get('model_type') or hf.get('architectures')} model, not a Llama"
    if bool(hf.get("attention_bias", False)) != bool(hf.get("mlp_bias", False)):
        return "its attention and MLP biases differ (attention_bias, mlp_bias): model.add_bias_linear is one switch"
    wanted = llama_settings(hf)
    for key, value in wanted.items():
        have = getattr(model, key)
        if key == "num_query_groups":
            have = have or model.num_attention_heads
        if key == "ffn_hidden_size":
            have = ffn_hidden_size(model)
        if have != value:
            return f"model.{key} is {have}, the checkpoint's is {value}"
    return None
