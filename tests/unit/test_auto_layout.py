"""The values left to the planner (auto): the choice fits the GPU with its margin, nothing it
left out is faster beyond what it treats as equal, several GPUs get a layout, a resume keeps
its checkpoint's layout, explicit values win, and what cannot be chosen is refused in one line
naming the key."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pipeline.config import ConfigError
from pipeline.config.choices import Recompute
from pipeline.config.derived import Settled, settled
from pipeline.data.datasets import vocab_size
from pipeline.planning import auto, hardware, run_gpu
from pipeline.planning.parallel_layout import ParallelLayout
from pipeline.runtime.gpus import capacity_bytes
from tests.conftest import make_config

H200 = ("train=gpu", "cluster=slurm", "cluster.gpus_per_node=1", "cluster.gpu=H200")
H100_NODE = ("train=gpu", "cluster=slurm", "cluster.gpus_per_node=8", "cluster.gpu=H100")
ALL_AUTO = "parallel.tensor=auto, parallel.pipeline=auto, train.micro_batch_size=auto, "


def chosen_against_options(tmp_path, *overrides: str) -> tuple[auto.Option, list[auto.Option]]:
    cfg = make_config(tmp_path, *overrides)
    typed = make_config(tmp_path, *overrides, validate=False)
    hw = hardware.of(typed, run_gpu.of(typed).name)  # the GPU settle plans for
    options = auto.options(typed, vocab_size(typed)[0], hw)  # and its vocabulary
    picked = next(o for o in options if o.layout == ParallelLayout.of(cfg))
    return picked, options


@pytest.mark.parametrize("model", ["gpt-350m", "gpt-1.3b", "gpt-2.7b"])
def test_the_choice_fits_with_the_margin_and_nothing_left_out_is_faster(model, tmp_path):
    picked, options = chosen_against_options(
        tmp_path, *H200, f"model={model}", "train.global_batch_size=64"
    )
    limit = capacity_bytes(141) * (1 - auto.MARGIN)
    assert picked.memory <= limit
    for other in options:
        if other.tokens_per_s > picked.tokens_per_s * (1 + auto.TIE):
            assert other.memory > limit, other.layout.describe()
    cfg = make_config(tmp_path, *H200, f"model={model}", "train.global_batch_size=64")
    assert cfg.train.auto_choice.startswith(f"{ALL_AUTO}train.recompute=auto: TP=1 PP=1 DP=1")
    assert "cluster.gpu=H200" in cfg.train.auto_choice


def test_several_gpus_get_the_least_model_parallelism_about_as_fast_as_the_fastest(tmp_path):
    picked, options = chosen_against_options(tmp_path, *H100_NODE, "model=llama-8b")
    limit = capacity_bytes(80) * (1 - auto.MARGIN)
    fits = [o for o in options if o.memory <= limit]
    near = [o for o in fits if o.tokens_per_s >= fits[0].tokens_per_s * (1 - auto.LAYOUT_TIE)]
    model_parallel = lambda o: o.layout.tensor * o.layout.pipeline  # noqa: E731
    assert picked.memory <= limit and picked in near
    assert model_parallel(picked) == min(map(model_parallel, near)) > 1  # 8B needs some
    small = make_config(tmp_path, *H100_NODE, "model=gpt-350m")
    assert (small.parallel.tensor, small.parallel.pipeline) == (1, 1)  # data parallel alone


def test_what_runs_reads_the_settled_values_typed_and_auto_only_before(tmp_path):
    cfg = make_config(tmp_path, *H200, "model=gpt-350m")
    s = settled(cfg)
    assert isinstance(s, Settled) and isinstance(s.recompute, Recompute)
    assert all(type(n) is int for n in (s.tensor, s.pipeline, s.micro_batch_size))
    assert (s.tensor, s.pipeline, s.micro_batch_size, s.recompute) == (
        cfg.parallel.tensor,
        cfg.parallel.pipeline,
        cfg.train.micro_batch_size,
        cfg.train.recompute,
    )  # config.yaml and the records keep the values under their keys
    assert s.recompute != "auto" and cfg.train.auto_choice
    with pytest.raises(ValueError, match="not settled"):
        settled(make_config(tmp_path, *H200, "model=gpt-350m", validate=False))


LLAMA_70B = (
    "model=llama-8b",
    "model.num_layers=80",
    "model.hidden_size=8192",
    "model.num_attention_heads=64",
    "model.ffn_hidden_size=28672",
    "cluster.nodes=8",
    "train.global_batch_size=512",
)


def test_sequence_parallelism_is_on_with_tensor_parallelism_unless_turned_off(tmp_path):
    """The planner's layout typed in is planned as the planner planned it: a 70B model on 64
    H100s with TP=4 PP=8 keeps sequence parallelism, so it needs no full recompute."""
    typed = make_config(
        tmp_path, *H100_NODE, *LLAMA_70B, "parallel.tensor=4", "parallel.pipeline=8"
    )
    assert typed.parallel.sequence_parallel is True and typed.train.recompute != "full"
    assert ParallelLayout.of(typed).sequence_parallel
    off = make_config(
        tmp_path,
        *H100_NODE,
        *LLAMA_70B,
        "parallel.pipeline=8",
        "parallel.sequence_parallel=false",
    )
    assert off.parallel.tensor > 1 and off.parallel.sequence_parallel is False  # the user's word
    one = make_config(tmp_path, *H100_NODE, "model=gpt-350m", "parallel.tensor=1")
    cpu = make_config(tmp_path, "train=cpu", "parallel.tensor=2", "cluster.tasks_per_node=2")
    assert one.parallel.sequence_parallel is False and cpu.parallel.sequence_parallel is False


def test_a_resume_keeps_the_layout_its_checkpoint_was_saved_with(tmp_path):
    saved = tmp_path / "checkpoints" / "iter_0000100"
    saved.mkdir(parents=True)
    layout = {"tensor": 2, "pipeline": 1, "virtual_pipeline": None}
    (saved / "state.json").write_text(json.dumps({"step": 100, "layout": layout}))
    (tmp_path / "checkpoints" / "latest.txt").write_text("iter_0000100\n")
    cfg = make_config(tmp_path, *H100_NODE, "model=gpt-1.3b")
    assert (cfg.parallel.tensor, cfg.parallel.pipeline, cfg.parallel.sequence_parallel) == (
        2,
        1,
        True,
    )
    assert "TP=2 PP=1 DP=4 (as the checkpoint to resume was saved)" in cfg.train.auto_choice


def test_a_bigger_gpu_gets_a_bigger_micro_batch(tmp_path):
    def micro(gpu: str) -> int:
        cfg = make_config(tmp_path, *H200, "model=gpt-1.3b", f"cluster.gpu={gpu}")
        return cfg.train.micro_batch_size

    assert micro("A100-40GB") < micro("H100") < micro("H200")


def test_within_the_tie_the_option_with_less_memory_is_taken():
    small = auto.Option(ParallelLayout(micro_batch=8), memory=40 << 30, tokens_per_s=1000.0)
    big = auto.Option(ParallelLayout(micro_batch=16), memory=70 << 30, tokens_per_s=1005.0)
    huge = auto.Option(ParallelLayout(micro_batch=32), memory=150 << 30, tokens_per_s=1100.0)
    chosen, best, too_big = auto.choose([huge, big, small], 100 << 30)
    assert (chosen, best, too_big) == (small, big, huge)
    faster = replace(big, tokens_per_s=1050.0)  # beyond the tie: speed wins
    assert auto.choose([huge, faster, small], 100 << 30)[0] is faster


def test_explicit_values_win(tmp_path):
    given = make_config(
        tmp_path, *H200, "model=gpt-1.3b", "train.micro_batch_size=2", "parallel.tensor=1"
    )
    assert given.train.micro_batch_size == 2 and given.train.recompute == "none"
    assert given.train.auto_choice.startswith(
        "parallel.pipeline=auto, train.recompute=auto: TP=1 PP=1 DP=1 (the only layout), "
        "micro-batch 2 x accumulation 128"
    )
    full = make_config(tmp_path, *H200, "model=gpt-2.7b", "train.recompute=full")
    assert full.train.recompute == "full" and full.train.micro_batch_size > 8
    tensor = make_config(tmp_path, *H100_NODE, "model=gpt-1.3b", "parallel.tensor=4")
    assert tensor.parallel.tensor == 4 and tensor.parallel.sequence_parallel is True
    neither = make_config(
        tmp_path,
        *H200,
        "train.micro_batch_size=4",
        "train.recompute=none",
        "parallel.tensor=1",
        "parallel.pipeline=1",
    )
    assert neither.train.auto_choice is None


def test_a_given_accumulation_fixes_the_micro_batch(tmp_path):
    cfg = make_config(tmp_path, *H200, "model=gpt-1.3b", "train.grad_accum=64")
    assert (cfg.train.micro_batch_size, cfg.train.grad_accum) == (4, 64)
    with pytest.raises(ConfigError, match=r"^train.grad_accum: 48 does not divide the 256"):
        make_config(tmp_path, *H200, "model=gpt-1.3b", "train.grad_accum=48")


def test_cpu_ranks_get_the_cpu_default(tmp_path):
    cfg = make_config(tmp_path, "train.micro_batch_size=auto", "train.global_batch_size=36")
    assert (cfg.train.micro_batch_size, cfg.train.grad_accum) == (6, 6)
    assert cfg.train.auto_choice == (
        "train.micro_batch_size=auto: micro-batch 6, recompute none (CPU ranks: up to 8)"
    )


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["train=gpu", "cluster=slurm", "cluster.gpus_per_node=8"],
            "train.micro_batch_size: auto needs the GPUs' memory; set cluster.gpu",
        ),
        (
            ["train=gpu", "cluster=slurm", "cluster.gpus_per_node=8", "train.micro_batch_size=8"],
            "train.recompute: auto needs the GPUs' memory; set cluster.gpu (H100, H200, ...) or "
            "cluster.gpu_memory_gb, or give train.recompute, parallel.tensor, parallel.pipeline "
            "a value",
        ),
        (
            [*H200, "model=llama-8b", "cluster.gpu=L4"],
            "train.micro_batch_size: auto found no layout, micro-batch and recompute that fit "
            "24.0 GiB",
        ),
        (
            [*H100_NODE, "train.global_batch_size=12"],
            "train.global_batch_size: 12 does not split over the job's 8 GPUs",
        ),
        (
            ["train=gpu", "cluster=slurm", "cluster.gpus_per_node=1", "cluster.gpu=H2000"],
            "cluster.gpu: H2000 is not a GPU the planner knows (H200, H100,",
        ),
        (["train.micro_batch_size=abc"], "train.micro_batch_size: 'abc' is not a whole number"),
        (["parallel.tensor=0"], "parallel.tensor: 0 is not >= 1 or auto"),
        (["train.recompute=some"], "train.recompute: 'some' is not one of none, selective"),
        (["train.auto_choice=x"], "train.auto_choice: is set by the planner"),
    ],
)
def test_what_cannot_be_chosen_is_refused_naming_the_key(overrides, message, tmp_path):
    with pytest.raises(ConfigError) as error:
        make_config(tmp_path, *overrides)
    assert str(error.value).startswith(message), str(error.value)


def test_the_pipeline_sizes_open_to_the_planner_follow_the_uneven_split(tmp_path):
    """23 layers split over no pipeline of a node's 8 GPUs; with the embedding counted as a
    layer, 24 split over 2, 4 and 8, and the planner chooses among them."""
    odd = (*H100_NODE, "model=gpt-1.3b", "model.num_layers=23", "parallel.tensor=1")
    counted = "parallel.account_for_embedding=true"
    even, uneven = (
        auto.open_sizes(cfg, auto.constraints(cfg)[0])
        for cfg in (
            make_config(tmp_path, *odd, validate=False),
            make_config(tmp_path, *odd, counted, validate=False),
        )
    )
    assert [q for _, q in even] == [1]
    assert [q for _, q in uneven] == [1, 2, 4, 8]
    cfg = make_config(tmp_path, *odd, counted, "train.global_batch_size=64")
    assert cfg.model.num_layers == 23 and cfg.parallel.pipeline in (1, 2, 4, 8)


def test_the_planner_lays_out_the_ranks_a_context_group_leaves(tmp_path):
    """8 GPUs, 2 context ranks: tensor x pipeline takes at most 4 of them."""
    cfg = make_config(tmp_path, *H100_NODE, "model=llama-8b", "parallel.context=2", validate=False)
    layouts = auto.open_sizes(cfg, auto.constraints(cfg)[0])
    assert layouts and max(t * q for t, q in layouts) == 4
