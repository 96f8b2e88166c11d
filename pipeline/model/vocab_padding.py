"""The model's real vocabulary inside megatron-core's padded one.

megatron-core pads the embedding and output layer to a multiple of
model.make_vocab_size_divisible_by x parallel.tensor rows (1000 pieces -> 1024). Left alone, the
padding rows are logits like any other: the softmax gives them probability, so every loss and
perplexity would be that of a 1024-way model, while the exported model (which has the tokenizer's
1000 rows only) is a 1000-way one. Their logits are set to the dtype's lowest value as the output
layer makes them, on every tensor-parallel shard, so:

- training, validation and evaluation measure the model over its real vocabulary, the one the
  export gives users (the same loss to float precision);
- no gradient reaches the padding rows from the loss, so training spends nothing on pushing
  their probability down (weight decay alone shrinks them; the export drops them);
- generation never samples an id the tokenizer cannot decode.

A finite lowest value rather than -inf: a block of logits that is all padding (a shard of a
small vocabulary under wide tensor parallelism) would make an online softmax compute -inf - -inf.
"""

from __future__ import annotations

import torch


def first_padding_column(vocab_size: int, padded_vocab_size: int, width: int, tp_rank: int) -> int:
    """Where padding starts among the `width` logits this rank holds: the whole padded
    vocabulary when gathered, else the rank's contiguous shard of it (`width` when none of
    it is padding)."""
    first_id = 0 if width == padded_vocab_size else tp_rank * width
    return min(max(vocab_size - first_id, 0), width)


def mask_padding(output_layer: torch.nn.Module, vocab_size: int, padded_vocab_size: int) -> None:
    """Make `output_layer` (megatron-core's ColumnParallelLinear, on this rank's shard of the
    padded vocabulary) give its padding columns the lowest logit."""
    if padded_vocab_size <= vocab_size:
        return
    from megatron.core import parallel_state

    def hook(module: torch.nn.Module, args, output):
        logits = output[0] if isinstance(output, tuple) else output
        width = logits.shape[-1]
        rank = parallel_state.get_tensor_model_parallel_rank()
        start = first_padding_column(vocab_size, padded_vocab_size, width, rank)
        if start < width:  # in place: the layer's backward needs its inputs, not its output
            logits[..., start:].fill_(torch.finfo(logits.dtype).min)
        return output

    output_layer.register_forward_hook(hook)
