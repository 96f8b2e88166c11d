"""Config composition, typed once, and the checks users rely on before anything runs."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline import config
from pipeline.config import ConfigError, PipelineConfig, derived
from pipeline.config.checks import check
from pipeline.config.schema import SourceConfig
from tests.conftest import CONF, make_config

GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir())


@pytest.mark.parametrize(
    "group,option",
    [(g, f.stem) for g in GROUPS for f in sorted((CONF / g).glob("*.yaml"))],
)
def test_every_config_file_composes(group, option, tmp_path):
    overrides = [f"{group}={option}"]
    if group == "data" and option == "jsonl":
        corpus = tmp_path / "c.jsonl"
        corpus.write_text('{"text": "hello"}\n')
        overrides.append(f"data.inputs=[{corpus}]")
    if group == "data" and option == "mixture":
        for name in ("web", "code", "books"):
            (tmp_path / f"{name}.jsonl").write_text('{"text": "hello", "content": "x = 1"}\n')
            overrides.append(f"data.sources.{name}.inputs=[{tmp_path / name}.jsonl]")
    if option == "gpu":  # its micro-batch and recompute are auto: chosen for a GPU
        overrides.append("cluster.gpu=H100")
    if (group == "model" and option != "tiny") or option == "gpu-cluster":
        # a layout that divides the big shapes and a batch that divides across 16 GPUs
        overrides += ["cluster.gpus_per_node=8", "train.global_batch_size=256"]
    cfg = make_config(tmp_path, *overrides)
    assert getattr(cfg, group) is not None


def test_the_composed_config_is_typed(tmp_path):
    cfg = make_config(tmp_path, "model=gpt-125m")
    assert isinstance(cfg, PipelineConfig)
    assert isinstance(cfg.model, config.ModelConfig) and cfg.model.name == "gpt-125m"
    assert cfg.workdir == str(tmp_path)


def test_grad_accum_is_derived_from_batch_sizes(tmp_path):
    cfg = make_config(tmp_path, "train.micro_batch_size=4", "train.global_batch_size=32")
    assert cfg.train.grad_accum == 8


def test_validation_never_changes_the_config_it_checks(tmp_path):
    """Derived values come back in a new config; the one checked is left as it was."""
    given = make_config(
        tmp_path,
        "train.global_batch_size=32",
        "train.hold_global_batch=true",
        "train.grad_accum=2",
        validate=False,
    )
    before = dataclasses.asdict(given)
    check(given)
    resolved = derived.resolve(given)
    assert dataclasses.asdict(given) == before
    assert (given.train.micro_batch_size, given.train.grad_accum) == (8, 2)
    assert (resolved.train.micro_batch_size, resolved.train.grad_accum) == (16, 2)


def test_a_saved_config_reads_back_as_the_same_typed_config(tmp_path):
    cfg = make_config(tmp_path, "model=gpt-350m", "+eval.extra_sets={}", "cluster.setup=[a, b]")
    path = tmp_path / "config.yaml"
    path.write_text(config.to_yaml(cfg))
    assert config.read(path) == cfg


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["train.micro_batch_size=4", "train.global_batch_size=30"], "train.global_batch_size"),
        (
            ["train.micro_batch_size=4", "train.global_batch_size=32", "train.grad_accum=2"],
            "train.global_batch_size",
        ),
        (["model.num_attention_heads=3"], "model.hidden_size"),
        (["model.num_query_groups=3"], "model.num_query_groups"),
        (["model.make_vocab_size_divisible_by=0"], "model.make_vocab_size_divisible_by"),
        (
            ["cluster.gpus_per_node=2", "parallel.tensor=2", "model.num_query_groups=1"],
            "parallel.tensor",
        ),
        (
            ["cluster.gpus_per_node=2", "parallel.pipeline=2", "model.num_layers=3"],
            "parallel.pipeline",
        ),
        (["parallel.tensor=3"], "parallel.tensor"),
        (["stages=[train,tokenize]"], "stages"),
        (["stages=[tokenise]"], "stages"),
        (["data.inputs=[/nonexistent/*.jsonl]"], "data.inputs"),
        (["data.split='90,10'"], "data.split"),
        (["data.split='90,10,0'"], "data.split"),
        (["tokenizer.model=/nonexistent.model"], "tokenizer.model"),
        (["train.precision=fp64"], "train.precision"),
        (["train.recompute=some"], "train.recompute"),
        (["train.warmup_steps=5000"], "train.warmup_steps"),
        (["model.seq_length=4096", "model.max_position_embeddings=2048"], "model.seq_length"),
        (["+eval.extra_sets.wiki=/nonexistent/*.jsonl"], "eval.extra_sets.wiki"),
        (["+eval.extra_sets.test=/nonexistent.jsonl"], "eval.extra_sets.test"),
        (["eval.max_batches=0"], "eval.max_batches"),
        (["model.num_query_groups=-1"], "model.num_query_groups"),  # was accepted
        (["model.num_query_groups=0"], "model.num_query_groups"),  # was multi-head
        (["model.max_position_embeddings=-1"], "model.max_position_embeddings"),
        (  # reached the planner, which divided by it
            ["train.micro_batch_size=0", "parallel.tensor=auto", "cluster.gpu=H100"],
            "train.micro_batch_size",
        ),
    ],
)
def test_invalid_config_names_the_key(overrides, key, tmp_path):
    with pytest.raises(ConfigError) as error:
        make_config(tmp_path, *overrides)
    assert str(error.value).startswith(f"{key}:"), error.value


def test_a_row_filter_on_a_source_read_as_text_by_the_data_format_is_refused(tmp_path):
    cfg = make_config(tmp_path, "data.format=text")
    source = SourceConfig(inputs=[], where="language_score >= 0.9")  # its format: data.format
    mixture = dataclasses.replace(cfg.data, sources={"web": source})
    with pytest.raises(ConfigError, match=r"^data.sources.web.where: filters Parquet or Arrow"):
        check(dataclasses.replace(cfg, data=mixture))


GPU_NODE = ("train=gpu", "cluster=slurm", "cluster.gpus_per_node=8", "cluster.gpu=H100")


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["parallel.tensor=3"], "parallel.tensor: 3 does not divide the job's 8 ranks"),
        (["parallel.pipeline=3"], "parallel.pipeline: 3 does not divide the job's 8 ranks"),
        (["parallel.tensor=16", "parallel.pipeline=1"], "parallel.tensor: 16 does not divide"),
        (
            ["cluster.nodes=3", "model=gpt-1.3b", "parallel.tensor=3"],
            "parallel.tensor: 3 does not divide the attention heads (16)",
        ),
        (
            ["cluster.nodes=5", "model=gpt-1.3b", "parallel.pipeline=5"],
            "parallel.pipeline: model.num_layers=24 is not divisible by pipeline",
        ),
        (["cluster.tasks_per_node=100"], "cluster.tasks_per_node: 100 != cluster.gpus_per_node=8"),
        (
            ["cluster.tasks_per_node=100", "parallel.tensor=1", "parallel.pipeline=1"],
            "cluster.tasks_per_node: 100",
        ),
    ],
)
def test_a_wrong_layout_or_cluster_key_is_blamed_not_the_batch(overrides, message, tmp_path):
    """Checked before the batch arithmetic, whichever of the other values are left to the
    planner."""
    with pytest.raises(ConfigError) as error:
        make_config(tmp_path, *GPU_NODE, "train.global_batch_size=120", *overrides)
    assert str(error.value).startswith(message), error.value


# Llama 3.1 405B's 126 layers on 128 GPUs (TP=8), with the layouts published for it
LLAMA_405B = (
    *GPU_NODE,
    "cluster.nodes=16",
    "model=llama-8b",
    "model.num_layers=126",
    "parallel.tensor=8",
    "train.micro_batch_size=1",
    "train.recompute=none",
    "train.global_batch_size=512",
)
BOTH_COUNTED = ("parallel.account_for_embedding=true", "parallel.account_for_loss=true")


@pytest.mark.parametrize(
    "layout,stages",
    [(["parallel.pipeline=16"], 16), (["parallel.pipeline=8", "parallel.virtual_pipeline=8"], 64)],
)
def test_layers_the_stages_do_not_divide_are_refused_with_megatrons_uneven_split_named(
    layout, stages, tmp_path
):
    """Refused as before, with the keys that make the split whole; given, they are accepted."""
    with pytest.raises(ConfigError) as error:
        make_config(tmp_path, *LLAMA_405B, *layout)
    assert str(error.value) == (
        "parallel.pipeline: model.num_layers=126 is not divisible by pipeline x virtual stages "
        f"= {stages}; uneven first and last stages split it: " + " ".join(BOTH_COUNTED)
    )
    cfg = make_config(tmp_path, *LLAMA_405B, *layout, *BOTH_COUNTED)
    assert cfg.parallel.account_for_embedding and cfg.parallel.account_for_loss


def test_an_uneven_split_that_still_does_not_divide_is_refused_naming_what_counts(tmp_path):
    with pytest.raises(ConfigError) as error:
        make_config(
            tmp_path, *LLAMA_405B, "parallel.pipeline=16", "parallel.account_for_embedding=true"
        )
    assert str(error.value) == (
        "parallel.pipeline: model.num_layers=126 with the embedding counted as layers (127) is "
        "not divisible by pipeline x virtual stages = 16"
    )


def test_context_parallelism_takes_its_share_of_the_ranks(tmp_path):
    cfg = make_config(tmp_path, *LLAMA_405B, "parallel.pipeline=1", "parallel.context=2")
    assert derived.data_parallel_size(cfg) == 128 // (8 * 2)
    with pytest.raises(ConfigError, match=r"^parallel.context: 3 does not divide the job's 128"):
        make_config(tmp_path, *LLAMA_405B, "parallel.pipeline=auto", "parallel.context=3")
    with pytest.raises(ConfigError) as error:
        make_config(tmp_path, *LLAMA_405B, "parallel.pipeline=2", "parallel.context=16")
    assert str(error.value).startswith(
        "parallel.context: tensor x pipeline x context = 256 does not divide the job's 128 ranks"
    )


@pytest.mark.parametrize("word", ["3", "0.5", "and"])
def test_a_word_the_shell_split_from_a_value_is_named_with_a_form_that_reads(word):
    """`data.where=score >= 3` unquoted: the shell passes `data.where=score` and `3` (and
    redirects to a file named `=`); the stray word is named, with a quoted form Hydra reads."""
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser

    from pipeline.config import overrides

    with pytest.raises(ConfigError) as error:
        overrides.for_hydra(word)
    line = str(error.value)
    assert line.startswith(f"{word}: not an override (KEY=VALUE)") and "\n" not in line
    [suggested] = shlex.split(line.rsplit("e.g. ", 1)[1])
    assert OverridesParser.create().parse_overrides([suggested])[0].value() == "score >= 3"
    assert overrides.for_hydra("~data.where") == "~data.where"  # a deletion has no value
