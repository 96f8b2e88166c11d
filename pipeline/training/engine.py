"""A megatron-core model ready to run: distributed set-up, the backend, the model chunks, and
forward/backward through megatron-core's schedules. Training and evaluation both build on it."""

from __future__ import annotations

import itertools
import os
from functools import partial

import torch
import torch.distributed as dist

from pipeline.config import PipelineConfig
from pipeline.config.derived import settled
from pipeline.core import log
from pipeline.data.datasets import MicroBatchSampler, loader
from pipeline.model import gpt
from pipeline.model.backends import base as backends
from pipeline.model.sizes import padded_vocab
from pipeline.runtime import distributed, placement


def _forward_step(device: torch.device, data_iterator, model):
    """megatron-core's forward_step_func: one micro-batch through the model, loss to be reduced."""
    batch = next(data_iterator)
    tokens = batch["tokens"].to(device, non_blocking=True)
    labels = batch["labels"].to(device, non_blocking=True)
    loss_mask = batch["loss_mask"].to(device, non_blocking=True).float()
    positions = batch["position_ids"].to(device, non_blocking=True)
    output = model(tokens, positions, None, labels=labels)

    def loss_func(per_token_loss: torch.Tensor):
        loss_sum = (per_token_loss.float() * loss_mask).sum()
        count = loss_mask.sum()
        return loss_sum / count.clamp(min=1), {"loss": torch.stack([loss_sum.detach(), count])}

    return output, loss_func


class Engine:
    def __init__(self, cfg: PipelineConfig, vocab_size: int, padded_vocab_size: int | None = None):
        """`vocab_size`: the tokenizer's pieces; `padded_vocab_size`: the rows of a checkpoint
        written under another tensor-parallel size (None: this layout's padding)."""
        from megatron.core import parallel_state, tensor_parallel

        self.cfg = cfg
        self.settled = s = settled(cfg)  # the layout and micro-batch, typed
        self.vocab_size = vocab_size
        self.padded_vocab_size = padded_vocab_size or padded_vocab(vocab_size, cfg.model, s.tensor)
        self.backend = backends.select(cfg)
        self.device = self.backend.device
        self.rank = distributed.init("nccl" if self.device.type == "cuda" else "gloo")
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(
                s.tensor,
                s.pipeline,
                virtual_pipeline_model_parallel_size=cfg.parallel.virtual_pipeline,
                expert_model_parallel_size=cfg.parallel.expert,
                expert_tensor_parallel_size=cfg.parallel.expert_tensor,
            )
        torch.manual_seed(cfg.train.seed)
        if self.device.type == "cuda":
            tensor_parallel.model_parallel_cuda_manual_seed(cfg.train.seed)
        self.chunks = self.backend.wrap(self._build_model(), cfg)
        self.dp_rank = parallel_state.get_data_parallel_rank()
        self.dp_size = parallel_state.get_data_parallel_world_size()  # of this job, as launched
        # the last rank is on the last pipeline stage, where the loss is
        self.is_logger = self.rank.rank == self.rank.world_size - 1
        log.RankFilter.logs = self.is_logger  # the other ranks' lines would repeat its own

    def placement(self) -> list[dict]:
        """Every rank's node, local rank and coordinates in the layout (on every rank)."""
        from megatron.core import parallel_state

        return placement.gather(
            {
                "rank": self.rank.rank,
                "node": placement.node_name(),
                "local_rank": self.rank.local_rank,
                "tensor": parallel_state.get_tensor_model_parallel_rank(),
                "pipeline": parallel_state.get_pipeline_model_parallel_rank(),
                "data": self.dp_rank,
                "pid": os.getpid(),
            }
        )

    def _build_model(self) -> list[torch.nn.Module]:
        from megatron.core import parallel_state

        vp = self.cfg.parallel.virtual_pipeline
        chunks = []
        for stage in range(vp or 1):
            vp_stage = stage if vp else None
            chunk = gpt.build(
                self.cfg,
                self.vocab_size,
                self.backend,
                pre_process=parallel_state.is_pipeline_first_stage(
                    ignore_virtual=False, vp_stage=vp_stage
                ),
                post_process=parallel_state.is_pipeline_last_stage(
                    ignore_virtual=False, vp_stage=vp_stage
                ),
                vp_stage=vp_stage,
                padded_vocab_size=self.padded_vocab_size,
            )
            chunks.append(chunk.to(self.device))
        return chunks

    def parallel_layout(self) -> dict:
        """The parallel layout and shape the weights are held in (a checkpoint's "layout"):
        what an evaluation elsewhere (one device, another layer spec) needs to rebuild the
        same model."""
        s = self.settled
        return {
            "tensor": s.tensor,
            "pipeline": s.pipeline,
            "virtual_pipeline": self.cfg.parallel.virtual_pipeline,
            "account_for_embedding": self.cfg.parallel.account_for_embedding,
            "account_for_loss": self.cfg.parallel.account_for_loss,
            "expert": self.cfg.parallel.expert,
            "padded_vocab_size": self.padded_vocab_size,
            "precision": self.cfg.train.precision,
            "backend": self.backend.name,
        }

    def iterators(
        self, dataset, start: int, micro_batch_size: int, limit: int | None = None
    ) -> list:
        sampler = MicroBatchSampler(
            len(dataset), micro_batch_size, self.dp_rank, self.dp_size, start
        )
        workers = 2 if self.device.type == "cuda" else 0

        def one():
            it = iter(loader(dataset, sampler, workers))
            return itertools.islice(it, limit) if limit else it

        return [one() for _ in self.chunks]  # each model chunk walks the same micro-batches

    def run_schedule(
        self, iterators: list, num_microbatches: int, micro_batch_size: int, forward_only: bool
    ) -> torch.Tensor:
        """Forward (and backward) over micro-batches; returns [loss sum, tokens] over the job."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        with self.backend.schedule_context():
            outputs = get_forward_backward_func()(
                forward_step_func=partial(_forward_step, self.device),
                data_iterator=iterators if len(iterators) > 1 else iterators[0],
                model=self.chunks if len(self.chunks) > 1 else self.chunks[0],
                num_microbatches=num_microbatches,
                seq_length=self.cfg.model.seq_length,
                micro_batch_size=micro_batch_size,
                forward_only=forward_only,
            )
        total = torch.zeros(2, dtype=torch.float64, device=self.device)
        for out in outputs:  # empty except on the last pipeline stage
            total += out["loss"].to(self.device, torch.float64)
        if dist.is_initialized():
            dist.all_reduce(total)  # over data-parallel ranks (tensor-parallel copies cancel out)
        return total

    @torch.no_grad()
    def loss_over(
        self, dataset, micro_batch_size: int, max_batches: int | None
    ) -> tuple[float, int]:
        """Mean token loss over the first max_batches micro-batches per rank (all if None)."""
        batches = len(MicroBatchSampler(len(dataset), micro_batch_size, 0, self.dp_size))
        batches = min(batches, max_batches) if max_batches else batches
        for chunk in self.chunks:
            chunk.eval()
        total = self.run_schedule(
            self.iterators(dataset, 0, micro_batch_size, batches),
            batches,
            micro_batch_size,
            forward_only=True,
        )
        for chunk in self.chunks:
            chunk.train()
        return float(total[0] / total[1].clamp(min=1)), int(total[1])
