"""A parallel layout: how training spreads over GPUs (tensor, pipeline, data parallelism),
with the micro-batch, accumulation, recompute and precision that shape its memory and speed."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config import ModelConfig, PipelineConfig
from pipeline.config.derived import (
    data_parallel_size,
    sequence_parallel,
    settled,
    trains_on_gpu,
)
from pipeline.model import figures
from pipeline.model.figures import ModelFigures
from pipeline.model.stages import EVEN, PipelineSplit


@dataclass(frozen=True)
class ParallelLayout:
    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    micro_batch: int = 1
    grad_accum: int = 1
    recompute: str = "none"  # none | selective | full
    recompute_layers: int | None = None  # full recompute: layers recomputed per stage
    virtual_pipeline: int | None = None
    # the embedding or the loss counted as a layer: fewer layers on the first or last stage
    pipeline_split: PipelineSplit = EVEN
    sequence_parallel: bool = False
    context: int = 1  # context-parallel ranks (published runs, planned runs; trained with 1)
    # MoE: experts shared out over `expert` ranks inside data parallelism, each expert split over
    # `expert_tensor` ranks (None: tensor)
    expert: int = 1
    expert_tensor: int | None = None
    # published MoE runs: the dispatcher's all-to-alls overlapped with another micro-batch's
    # compute (megatron-core's moe_a2a_overlap), a dispatcher that never waits on the host
    # (CUDA-graphed router and preprocessing), one that sends a token once to each other node
    # (HybridEP, DeepEP); this pipeline runs megatron-core's plain all-to-all dispatcher
    ep_comm_overlap: bool = False
    dispatcher_host_sync: bool = True
    ep_dedup: bool = False
    distributed_optimizer: bool = True
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    tp_comm_overlap: bool = False
    bucket_params: int | None = None  # gradient bucket; None: megatron-core's, max(40M, 1M x DP)
    fsdp: bool = False  # weights sharded too (published runs): a second all-gather in backward
    grad_reduce_fp32: bool = True  # gradients reduced in fp32 (this pipeline), else in bf16
    precision: str = "bf16"
    # The GPU backend: Transformer Engine's flash attention and fused cross-entropy.
    fused_kernels: bool = True

    @property
    def gpus(self) -> int:
        return self.tensor * self.pipeline * self.context * self.data

    @property
    def expert_tensor_size(self) -> int:
        return self.expert_tensor or self.tensor

    @property
    def expert_data(self) -> int:
        """Ranks holding the same experts, over which their optimizer state is sharded:
        megatron-core's TP x CP x DP = expert-TP x EP x expert-DP."""
        return self.tensor * self.context * self.data // (self.expert_tensor_size * self.expert)

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.data * self.grad_accum

    @classmethod
    def of(cls, cfg: PipelineConfig) -> ParallelLayout:
        """The layout a validated, resolved config describes."""
        p, t, s = cfg.parallel, cfg.train, settled(cfg)
        sp = sequence_parallel(cfg)
        return cls(
            tensor=s.tensor,
            pipeline=s.pipeline,
            data=data_parallel_size(cfg),
            micro_batch=s.micro_batch_size,
            grad_accum=t.grad_accum,
            recompute=s.recompute,
            recompute_layers=t.recompute_layers,
            virtual_pipeline=p.virtual_pipeline,
            pipeline_split=PipelineSplit.of(p),
            sequence_parallel=sp,
            context=p.context,
            expert=p.expert,
            expert_tensor=p.expert_tensor,
            distributed_optimizer=p.distributed_optimizer,
            overlap_grad_reduce=p.overlap_grad_reduce,
            # megatron-core gathers weights only with the distributed optimizer
            overlap_param_gather=p.overlap_param_gather and p.distributed_optimizer,
            tp_comm_overlap=p.tp_comm_overlap and s.tensor > 1 and sp,
            bucket_params=p.ddp_bucket_size,
            precision=t.precision,
            fused_kernels=trains_on_gpu(cfg),
        )

    def model_figures(self, m: ModelConfig, vocab_size: int) -> ModelFigures:
        """The model's figures for this layout's tensor and pipeline split."""
        return figures.of(
            m,
            vocab_size,
            self.tensor,
            self.pipeline,
            self.pipeline_split,
            self.expert,
            self.expert_tensor,
        )

    def describe(self) -> str:
        vp = f" (x{self.virtual_pipeline} virtual)" if self.virtual_pipeline else ""
        sp = ", sequence parallel" if self.sequence_parallel else ""
        if self.expert > 1 or self.expert_tensor:
            sp += f", EP={self.expert}" + (
                f" ETP={self.expert_tensor}" if self.expert_tensor else ""
            )
        return (
            f"TP={self.tensor} PP={self.pipeline}{vp} DP={self.data}, micro-batch "
            f"{self.micro_batch} x accumulation {self.grad_accum}, recompute {self.recompute}"
            f"{sp}, {self.precision}"
        )
