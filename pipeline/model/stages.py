"""How many transformer layers each pipeline rank holds: an even split, or Megatron's uneven
one, where the embedding (first rank) and the output layer with the loss (last rank) each count
as a layer (parallel.account_for_embedding, parallel.account_for_loss)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config import ParallelConfig


@dataclass(frozen=True)
class PipelineSplit:
    """What counts as a layer besides the transformer layers when they are shared out."""

    embedding: bool = False
    loss: bool = False

    @classmethod
    def of(cls, parallel: ParallelConfig) -> PipelineSplit:
        return cls(embedding=parallel.account_for_embedding, loss=parallel.account_for_loss)

    def units(self, num_layers: int) -> int:
        """What is shared out over the stages: the layers, and what counts as one."""
        return num_layers + self.embedding + self.loss

    def layers(self, num_layers: int, pipeline: int, stage: int) -> int:
        """Transformer layers on pipeline rank `stage`, all its virtual stages together."""
        per_rank = self.units(num_layers) // pipeline
        first, last = stage == 0, stage == pipeline - 1
        return per_rank - int(self.embedding and first) - int(self.loss and last)

    def most_layers(self, num_layers: int, pipeline: int) -> int:
        """The layers of the fullest rank (the middle ones, when the split is uneven)."""
        return max(self.layers(num_layers, pipeline, s) for s in range(pipeline))


EVEN = PipelineSplit()
