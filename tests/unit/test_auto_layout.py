"""train.micro_batch_size=auto and train.recompute=auto: the planner's choice fits the GPU with
its margin and no option it left out is both faster by the estimate and within the margin;
explicit values win; what cannot be chosen is refused in one line naming the key."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline.config import ConfigError
from pipeline.data.datasets import vocab_size
from pipeline.planning import auto
from pipeline.planning.parallel_layout import ParallelLayout
from pipeline.runtime.gpus import capacity_bytes
from tests.conftest import make_config

H200 = ("train=gpu", "cluster=slurm", "cluster.gpus_per_node=1", "cluster.gpu=H200")


@pytest.mark.parametrize("model", ["gpt-350m", "gpt-1.3b", "gpt-2.7b"])
def test_the_choice_fits_with_the_margin_and_nothing_left_out_is_faster(model, tmp_path):
    cfg = make_config(tmp_path, *H200, f"model={model}", "train.global_batch_size=64")
    typed = make_config(tmp_path, *H200, f"model={model}", "train.global_batch_size=64",
                        validate=False)  # fmt: skip
    options = auto.options(typed, vocab_size(typed)[0])  # the vocabulary settle plans for
    limit = capacity_bytes(141) * (1 - auto.MARGIN)
    chosen = ParallelLayout.of(cfg)
    picked = next(o for o in options if o.layout == chosen)
    assert picked.memory <= limit
    for other in options:
        if other.tokens_per_s > picked.tokens_per_s * (1 + auto.TIE):
            assert other.memory > limit, other.layout.describe()
    assert cfg.train.auto_choice.startswith("micro_batch_size=auto, recompute=auto: micro-batch ")
    assert "cluster.gpu=H200" in cfg.train.auto_choice


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
    given = make_config(tmp_path, *H200, "model=gpt-1.3b", "train.micro_batch_size=2")
    assert given.train.micro_batch_size == 2 and given.train.recompute == "none"
    assert given.train.auto_choice.startswith("recompute=auto: micro-batch 2 x accumulation 128")
    full = make_config(tmp_path, *H200, "model=gpt-2.7b", "train.recompute=full")
    assert full.train.recompute == "full" and full.train.micro_batch_size > 8
    neither = make_config(tmp_path, *H200, "train.micro_batch_size=4", "train.recompute=none")
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
        "micro_batch_size=auto: micro-batch 6, recompute none (CPU ranks: up to 8)"
    )


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["train=gpu", "cluster=slurm", "cluster.gpus_per_node=8"],
            "train.micro_batch_size: auto needs the GPUs' memory; set cluster.gpu",
        ),
        (
            [*H200, "model=llama-8b", "cluster.gpu=L4"],
            "train.micro_batch_size: auto found no micro-batch and recompute that fit 24.0 GiB",
        ),
        (["train.micro_batch_size=abc"], "train.micro_batch_size: 'abc' is not a whole number"),
        (["train.recompute=some"], "train.recompute: 'some' is not one of none, selective"),
        (["train.auto_choice=x"], "train.auto_choice: is set by the planner"),
    ],
)
def test_what_cannot_be_chosen_is_refused_naming_the_key(overrides, message, tmp_path):
    with pytest.raises(ConfigError) as error:
        make_config(tmp_path, *overrides)
    assert str(error.value).startswith(message), str(error.value)
