"""The model's figures for one vocabulary and one tensor x pipeline split, computed once: the
MLP, expert and head widths, the padded vocabulary, each stage's dense and MoE layers, the
parameters of a replica and of the stages' GPUs, and Megatron-LM's FLOPs. The memory and speed estimates, the plan and its printout read them here
rather than each working them out again from the model config."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pipeline.config import ModelConfig
from pipeline.model.flops import flops_per_sequence
from pipeline.model.parameters import layer_kinds, parameter_count, stage_params
from pipeline.model.sizes import expert_ffn_hidden_size, ffn_hidden_size, kv_channels, padded_vocab
from pipeline.model.stages import EVEN, PipelineSplit


@dataclass(frozen=True)
class ModelFigures:
    ffn_hidden_size: int
    expert_ffn_hidden_size: int  # one expert's MLP width (a dense model: ffn_hidden_size)
    kv_channels: int  # each attention head's width
    padded_vocab: int  # for the tensor-parallel size
    parameters: Mapping[str, int]  # one replica's (parameter_count)
    # one GPU's parameters (stage_params) of the first, second and last pipeline stage
    stages: Mapping[int, Mapping[str, int]]
    # (dense layers, MoE layers) of each pipeline stage, by stage, as the split shares them
    layer_kinds: tuple[tuple[int, int], ...]
    # the speed estimate's figures, as its constants were fitted: the fuller of the first and
    # last stage with the layers shared evenly (its experts' share apart, stage_params), and the
    # FLOPs with the vocabulary of one rank
    even_busiest_stage: Mapping[str, int]
    flops_per_sequence_tp1: float
    flops_per_sequence: float  # Megatron-LM's forward and backward FLOPs of one sequence


def of(
    m: ModelConfig,
    vocab_size: int,
    tensor: int,
    pipeline: int,
    split: PipelineSplit = EVEN,
    expert: int = 1,
    expert_tensor: int | None = None,
) -> ModelFigures:
    """The figures of model `m` with `vocab_size` pieces on `tensor` x `pipeline` GPUs, the
    layers shared out as `split` counts them, a MoE model's experts over `expert` x
    `expert_tensor` GPUs (none: `tensor`)."""
    experts = {"expert": expert, "expert_tensor": expert_tensor}
    stages = {
        s: stage_params(m, vocab_size, tensor, pipeline, s, split, **experts)
        for s in {0, 1, pipeline - 1}
        if s < pipeline
    }
    even = [stage_params(m, vocab_size, tensor, pipeline, s, **experts) for s in {0, pipeline - 1}]
    return ModelFigures(
        ffn_hidden_size=ffn_hidden_size(m),
        expert_ffn_hidden_size=expert_ffn_hidden_size(m),
        kv_channels=kv_channels(m),
        padded_vocab=padded_vocab(vocab_size, m, tensor),
        parameters=MappingProxyType(parameter_count(m, vocab_size, tensor)),
        stages=MappingProxyType({s: MappingProxyType(c) for s, c in stages.items()}),
        layer_kinds=tuple(layer_kinds(m, pipeline, s, split) for s in range(pipeline)),
        even_busiest_stage=MappingProxyType(max(even, key=lambda c: c["total"])),
        flops_per_sequence_tp1=flops_per_sequence(m, vocab_size, 1),
        flops_per_sequence=flops_per_sequence(m, vocab_size, tensor),
    )
