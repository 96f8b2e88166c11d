"""megatron-core's MoE layer as the CPU backend builds it: parameters counted from the built
model, router health counted by hooks on the routers, aux-loss-free biases moved against the
load."""

from __future__ import annotations

import pytest
import torch

from pipeline.model import gpt, moe
from pipeline.model.backends.cpu import CpuBackend
from pipeline.runtime import distributed
from pipeline.training.router_health import RouterHealth
from tests.conftest import make_config

VOCAB = 512


@pytest.fixture(scope="module")
def model_parallel():
    from megatron.core import parallel_state

    distributed.init("gloo")
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


def _trained_once(cfg, model) -> None:
    """One training forward and backward of a random batch."""
    torch.manual_seed(1)
    tokens = torch.randint(0, VOCAB, (2, cfg.model.seq_length))
    positions = torch.arange(cfg.model.seq_length).expand(2, -1)
    model.train()
    model(tokens, positions, None, labels=tokens).mean().backward()


def test_total_and_active_parameters_are_counted_from_the_built_model(model_parallel, tmp_path):
    cfg = make_config(tmp_path, "model=moe-tiny")
    model = gpt.build(cfg, VOCAB, CpuBackend())
    total, active = moe.parameter_counts([model], cfg.model)
    assert total == sum(p.numel() for p in model.parameters())
    expert = 128 * 2 * 128 + 128 * 128  # SwiGLU: gated fc1 and fc2, width 128
    assert total - active == 3 * (8 - 2) * expert  # layers 2-4: 6 of 8 experts idle per token


def test_router_health_counts_what_the_routers_sent_and_dropped(model_parallel, tmp_path):
    cfg = make_config(tmp_path, "model=moe-tiny", "model.moe.capacity_factor=0.5")
    model = gpt.build(cfg, VOCAB, CpuBackend())
    health = RouterHealth([model], cfg)
    _trained_once(cfg, model)
    record, loads = health.interval(micro_batches=1)
    assert [load.layer for load in loads] == [2, 3, 4]
    tokens = 2 * cfg.model.seq_length
    for load in loads:
        assert load.assigned == tokens * 2
        # an expert takes at most half its even share: at least half the assignments dropped
        assert max(load.tokens) <= 0.5 * tokens * 2 / 8 + 1 and load.dropped >= 0.5
    assert record["moe/dropped"] >= 0.5 and 0.5 < record["moe/aux_loss"] < 2
    with torch.no_grad():  # evaluation passes are not counted
        model.eval()
        model(torch.zeros(1, cfg.model.seq_length, dtype=torch.long), None, None)
    _, loads = health.interval(micro_batches=1)
    assert all(load.assigned == 0 for load in loads)


def test_aux_loss_free_biases_move_against_each_experts_load(model_parallel, tmp_path):
    cfg = make_config(tmp_path, "model=moe-tiny", "model.moe.router=aux_loss_free")
    model = gpt.build(cfg, VOCAB, CpuBackend())
    _trained_once(cfg, model)
    routers = moe.routers([model])
    loads = [r.local_tokens_per_expert.clone() for r in routers]
    moe.update_expert_bias([model])
    for router, load in zip(routers, loads, strict=True):
        expected = torch.sign(load.mean() - load) * moe.EXPERT_BIAS_UPDATE_RATE
        assert torch.equal(router.expert_bias, expected)  # from zero, one step
        assert router.expert_bias.device.type == "cpu"
        assert not router.local_tokens_per_expert.any()  # counted afresh for the next step
