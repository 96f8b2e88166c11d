"""Mixture of experts without training: the config's MoE checks each name their key, and the
router-health arithmetic says when routing has collapsed."""

from __future__ import annotations

import pytest

from pipeline.config import ConfigError
from pipeline.model import moe
from pipeline.training.router_health import LayerLoad, collapse, collapse_ratio, warning_line
from tests.conftest import make_config

TWO_RANKS = ["cluster.tasks_per_node=2"]


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["model=moe-tiny", "model.moe.top_k=9"], "model.moe.top_k"),
        (["model=moe-tiny", "model.moe.first_dense_layers=4"], "model.moe.first_dense_layers"),
        (["model=moe-tiny", *TWO_RANKS, "parallel.expert=3"], "parallel.expert"),
        # 2 ranks, tensor 2: data-parallel size 1, which expert parallelism 2 cannot split
        (
            ["model=moe-tiny", *TWO_RANKS, "parallel.tensor=2", "parallel.expert=2"],
            "parallel.expert",
        ),
        (["model=moe-tiny", "parallel.expert=2"], "parallel.expert"),  # one rank
        (["model=tiny", "model.moe.top_k=4"], "model.moe.top_k"),  # a dense model
        (["model=tiny", "model.moe.router=seq_aux_loss"], "model.moe.router"),
        (["model=tiny", *TWO_RANKS, "parallel.expert=2"], "parallel.expert"),
        (["model=tiny", "parallel.expert_tensor=1"], "parallel.expert_tensor"),
        (
            ["model=moe-tiny", "model.moe.router=aux_loss_free", "model.moe.aux_loss_coeff=0.1"],
            "model.moe.aux_loss_coeff",
        ),
        (
            ["model=moe-tiny", *TWO_RANKS, "parallel.tensor=2", "model.add_bias_linear=true"],
            "model.add_bias_linear",
        ),
    ],
)
def test_a_moe_mistake_names_its_key(overrides, key, tmp_path):
    with pytest.raises(ConfigError) as error:
        make_config(tmp_path, *overrides)
    assert str(error.value).startswith(f"{key}:"), error.value
    assert "\n" not in str(error.value)


def test_expert_parallelism_inside_data_parallelism_is_accepted(tmp_path):
    cfg = make_config(tmp_path, "model=moe-tiny", *TWO_RANKS, "parallel.expert=2")
    assert cfg.parallel.expert == 2


def test_megatron_core_gets_the_routers_settings(tmp_path):
    cfg = make_config(tmp_path, "model=moe-tiny", "model.moe.router=aux_loss_free")
    options = moe.transformer_options(cfg)
    assert options["moe_router_load_balancing_type"] == "none"
    assert options["moe_router_enable_expert_bias"] and options["moe_aux_loss_coeff"] == 0
    assert options["moe_router_score_function"] == "sigmoid"  # megatron-core biases no other
    assert options["moe_layer_freq"] == [0, 1, 1, 1]  # the first layer dense
    assert options["moe_ffn_hidden_size"] == 128
    assert moe.transformer_options(make_config(tmp_path, "model=tiny")) == {}


def test_even_routing_is_healthy():
    load = LayerLoad(layer=2, tokens=[100.0] * 8, assigned=800.0)
    assert load.max_over_mean == 1.0 and load.idle_experts == 0 and load.dropped == 0.0
    assert collapse(load, top_k=2) is None


def test_dropped_assignments_are_those_no_expert_took():
    load = LayerLoad(layer=1, tokens=[90.0, 60.0, 50.0, 50.0], assigned=400.0)
    assert load.dropped == pytest.approx(0.375)


def test_one_expert_taking_most_tokens_is_a_collapse():
    # 64 experts, top 2: an expert can take up to 32x the mean; past 4x is collapse
    tokens = [10.0] * 64
    tokens[5] = 10.0 * 5
    load = LayerLoad(layer=3, tokens=tokens, assigned=sum(tokens))
    assert collapse(load, top_k=2) == f"expert 5 took {load.max_over_mean:.1f}x its even share"


def test_the_collapse_limit_leaves_room_for_few_experts():
    # 8 experts, top 2: no expert can take over 4x the mean, so the limit is 90% of that
    assert collapse_ratio(8, 2) == pytest.approx(3.6)
    assert collapse_ratio(64, 8) == pytest.approx(4.0)


def test_half_the_experts_idle_is_a_collapse(tmp_path):
    load = LayerLoad(layer=4, tokens=[100.0, 100.0, 100.0, 100.0, 0, 0, 0, 0], assigned=400.0)
    problem = collapse(load, top_k=2)
    assert problem == "4 of 8 experts received no token"
    line = warning_line(40, load.layer, problem, make_config(tmp_path, "model=moe-tiny").model)
    assert line.startswith("warning: step 40: routing collapsed in MoE layer 4: 4 of 8 experts")
    assert "model.moe.aux_loss_coeff" in line and "\n" not in line
