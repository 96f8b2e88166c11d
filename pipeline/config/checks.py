"""The config's checks, before anything is written or submitted.

The schema already refused unknown keys and wrong types at composition. Here each key is held
to what its schema field declares (its choices, its rule, no control character in a value
that goes into job scripts), then the checks that read several keys run: batch arithmetic,
divisibility, what the stages need. It reads the config and never changes it: the first
problem is a ConfigError whose message starts with the key.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any

from pipeline.config import derived, inputs, keys
from pipeline.config.keys import value_at
from pipeline.config.moe_checks import check_moe
from pipeline.config.schema import AUTO, PipelineConfig
from pipeline.config.split_weights import Split
from pipeline.core.errors import ConfigError

# Control characters: a newline would end an #SBATCH line and start a shell command.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_NO_CONTROL = "must not contain a newline or other control character (it goes into a script)"


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def _not_one_of(value: object, allowed: tuple[str, ...]) -> str:
    return f"{str(value)!r} is not one of {', '.join(allowed)}"


def check(cfg: PipelineConfig) -> None:
    """Raise ConfigError for the first problem found."""
    check_each_key(cfg)
    for name, source in cfg.data.sources.items():
        check_each_key(source, f"data.sources.{name}.")
    check_across_keys(cfg)


def check_across_keys(cfg: PipelineConfig) -> None:
    """What holds between keys, on a config whose keys each hold to their own fields."""
    _check_data(cfg)
    _check_tokenizer(cfg)
    _check_model(cfg)
    # the layout and cluster keys before the batch arithmetic that uses them, so that a wrong
    # one is blamed, not train.global_batch_size
    _check_cluster(cfg)
    _check_parallel(cfg)
    check_moe(cfg)
    _check_batch(cfg)
    _check_train(cfg)
    _check_eval(cfg)


def check_each_key(section: Any, prefix: str = "") -> None:
    """Each leaf key against its own schema field: a value that is none of its choices (set by
    code, not composed), a control character in a value that goes into job scripts, a value
    that breaks its rule (pipeline.config.rules)."""
    for leaf in keys.leaves(section):
        name, value = prefix + leaf.name, value_at(section, leaf.name)
        if leaf.choices is not None:
            _require(value in leaf.choices, name, _not_one_of(value, leaf.choices))
        if leaf.info is None:
            continue
        if leaf.info.script:
            _refuse_control_characters(name, value)
        refusal = leaf.info.rule.refuse(name, value) if leaf.info.rule else None
        if refusal is not None:
            raise ConfigError(refusal)


def _refuse_control_characters(key: str, value: Any) -> None:
    """Values that end up in the sbatch scripts submitit writes. submitit quotes each value for
    the shell, so `x; rm -rf ~` stays one harmless word, but no quoting survives a newline.
    cluster.setup lines are shell by design: they run as written, like a site's module loads."""
    named = value.items() if isinstance(value, dict) else [(None, value)]
    for name, item in named:
        entry = key if name is None else f"{key}.{name}"
        for text in item if isinstance(item, list) else [item]:
            _require(text is None or not _CONTROL.search(str(text)), entry, _NO_CONTROL)


def _check_batch(cfg: PipelineConfig) -> None:
    """The batch arithmetic holds once the values it needs are numbers (auto ones are chosen
    by the planner, then checked again)."""
    t = cfg.train
    if AUTO in (cfg.parallel.tensor, cfg.parallel.pipeline):
        gpus = derived.world_size(cfg.cluster)
        _require(  # data parallelism alone must be open to the planner
            t.global_batch_size % gpus == 0,
            "train.global_batch_size",
            f"{t.global_batch_size} does not split over the job's {gpus} GPUs; give a multiple "
            "of it, or give parallel.tensor and parallel.pipeline",
        )
    if AUTO in (t.micro_batch_size, cfg.parallel.tensor, cfg.parallel.pipeline):
        return
    derived.batch(cfg)


def _check_train(cfg: PipelineConfig) -> None:
    t = cfg.train
    _require(
        t.warmup_steps < t.steps,
        "train.warmup_steps",
        f"{t.warmup_steps} must be in [0, train.steps={t.steps}): lower it with the steps",
    )
    _require(t.min_lr <= t.lr, "train.min_lr", f"{t.min_lr} must be in [0, train.lr={t.lr}]")
    if t.eval_iters is not None:  # an earlier version's key, worded in the others' terms
        samples = ""
        if AUTO not in (t.micro_batch_size, cfg.parallel.tensor, cfg.parallel.pipeline):
            samples = f"={t.eval_iters * t.micro_batch_size * derived.data_parallel_size(cfg)}"
        raise ConfigError(
            "train.eval_iters: counts micro-batches, so runs with other micro-batch sizes would "
            f"validate on other sequences; give train.eval_samples{samples} (sequences) instead"
        )
    ps = list(t.profile_steps)
    _require(
        not ps or (len(ps) == 2 and 1 <= ps[0] <= ps[1] <= t.steps),
        "train.profile_steps",
        f"{ps} is not [first, last] with 1 <= first <= last <= train.steps",
    )


def _check_cluster(cfg: PipelineConfig) -> None:
    gpus, tasks = cfg.cluster.gpus_per_node, cfg.cluster.tasks_per_node
    _require(
        not gpus or not tasks or tasks == gpus,
        "cluster.tasks_per_node",
        f"{tasks} != cluster.gpus_per_node={gpus} (one task per GPU)",
    )
    allowed = ("inprocess", "subprocess") if cfg.cluster.name == "local" else ("slurm",)
    executor = cfg.cluster.executor
    _require(executor in allowed, "cluster.executor", _not_one_of(executor, allowed))
    _require(
        cfg.cluster.container_image is not None or not cfg.cluster.container_mounts,
        "cluster.container_mounts",
        "needs cluster.container_image (the mounts are the container's)",
    )


def _check_eval(cfg: PipelineConfig) -> None:
    e = cfg.eval
    ckpt = str(e.checkpoint)
    named = ckpt not in ("best", "latest")
    _require(  # a folder a training of this command may still write is checked when read
        not named or os.path.isdir(ckpt) or ("train" in cfg.stages and not os.path.exists(ckpt)),
        "eval.checkpoint",
        f"{ckpt!r} is neither best, latest nor a checkpoint folder",
    )
    _check_downstream(cfg)
    if "evaluate" not in cfg.stages:
        return
    for name, pattern in e.extra_sets.items():
        key = f"eval.extra_sets.{name}"
        matches = [p for p in glob.glob(os.path.expanduser(str(pattern))) if os.path.isfile(p)]
        _require(bool(matches), key, f"{pattern!r} matches no file")
        for path in matches:
            _require(os.access(path, os.R_OK), key, f"{path} is not readable")


def _check_downstream(cfg: PipelineConfig) -> None:
    e = cfg.eval
    tasks = list(e.harness_tasks)
    _require(not e.harness_every or bool(tasks), "eval.harness_every", "needs eval.harness_tasks")
    _require(
        not e.harness_every or cfg.train.save_interval > 0,
        "eval.harness_every",
        "scores saved checkpoints: needs train.save_interval > 0",
    )
    task = str(e.select_by).partition("/")[0]
    _require(
        not e.select_by or task in tasks,
        "eval.select_by",
        f"task {task!r} is not among eval.harness_tasks ({', '.join(tasks) or 'none'})",
    )


def _refuse_filtered_text(key: str, fmt: str, where: str | None) -> None:
    """A row filter reads Parquet or Arrow columns; a text file has none. `key`: data or
    data.sources.NAME."""
    _require(
        where is None or fmt != "text",
        f"{key}.where",
        "filters Parquet or Arrow rows, not text files",
    )


def _refuse_empty(paths: list[str], key: str) -> None:
    """Files that hold not one byte: found here, before a run folder is made for them."""
    if paths and all(os.path.getsize(p) == 0 for p in paths):
        named = paths[0] if len(paths) == 1 else f"all {len(paths)} files ({paths[0]}, ...)"
        raise ConfigError(f"{key}: {named} {'is' if len(paths) == 1 else 'are'} empty")


def _check_sources(cfg: PipelineConfig) -> None:
    d = cfg.data
    _require(
        not (d.inputs and d.sources), "data.inputs", "give data.inputs or data.sources, not both"
    )
    owner: dict[tuple[int, int], str] = {}
    for name, source in d.sources.items():
        key = f"data.sources.{name}"
        _refuse_filtered_text(key, source.format or cfg.data.format, source.where)
        if "tokenize" not in cfg.stages:
            continue  # the data is tokenized: its inputs are not read again
        _require(bool(source.inputs), f"{key}.inputs", "needs at least one glob")
        found = []
        for pattern in source.inputs:
            for path in inputs.readable_files(str(pattern), f"{key}.inputs"):
                other = owner.setdefault(inputs.identity(path), name)  # a link is the file
                _require(other == name, f"{key}.inputs", f"{path} is in data.sources.{other} too")
                found.append(path)
        _refuse_empty(found, f"{key}.inputs")


def _check_data(cfg: PipelineConfig) -> None:
    d = cfg.data
    _refuse_filtered_text("data", d.format, d.where)
    if d.prepared:
        _require("tokenize" not in cfg.stages, "stages", "drop tokenize when data.prepared is set")
    _check_sources(cfg)
    if "tokenize" in cfg.stages and d.inputs:
        found = [p for pattern in d.inputs for p in inputs.readable_files(pattern, "data.inputs")]
        _refuse_empty(found, "data.inputs")
    weights = Split.of(d.split).weights
    _require(weights[1] > 0 or "train" not in cfg.stages, "data.split", "needs a validation share")
    _require(weights[2] > 0 or "evaluate" not in cfg.stages, "data.split", "needs a test share")


def _check_tokenizer(cfg: PipelineConfig) -> None:
    tk = cfg.tokenizer
    # none only beside a given model, whose pieces it does not set (derived.resolve)
    _require(bool(tk.model) or tk.vocab_size is not None, "tokenizer.vocab_size", "must be given")
    if not tk.model:  # a tokenizer to train: its fixed pieces come first
        fixed = 3 + len(tk.user_defined_symbols) + (256 if tk.byte_fallback else 0)
        _require(
            tk.vocab_size > fixed,
            "tokenizer.vocab_size",
            f"{tk.vocab_size} leaves no piece for text: a trained tokenizer holds {fixed} fixed "
            f"pieces (3 special, {len(tk.user_defined_symbols)} tokenizer.user_defined_symbols"
            + (", 256 bytes for tokenizer.byte_fallback" if tk.byte_fallback else "")
            + "); give that plus one per character of the corpus, and more for its words",
        )


def _check_model(cfg: PipelineConfig) -> None:
    m = cfg.model
    _require(
        m.hidden_size % m.num_attention_heads == 0,
        "model.hidden_size",
        f"{m.hidden_size} is not divisible by model.num_attention_heads={m.num_attention_heads}",
    )
    groups = m.num_query_groups or m.num_attention_heads
    _require(
        m.num_attention_heads % groups == 0,
        "model.num_query_groups",
        f"{groups} does not divide model.num_attention_heads={m.num_attention_heads}",
    )
    if m.init_from:
        sp_model = os.path.join(m.init_from, "tokenizer.model")
        _require(
            bool(cfg.tokenizer.model) or os.path.isfile(sp_model),
            "model.init_from",
            f"{m.init_from} has no tokenizer.model (a sentencepiece model, which the pipeline "
            "tokenizes with); give the one its weights were trained with as tokenizer.model=FILE",
        )
    limit = m.max_position_embeddings or m.seq_length
    _require(
        m.seq_length <= limit,
        "model.seq_length",
        f"{m.seq_length} exceeds model.max_position_embeddings={limit}",
    )


def _check_parallel(cfg: PipelineConfig) -> None:
    p, m = cfg.parallel, cfg.model
    # each size given is checked alone (the planner chooses an auto one, then it is checked
    # again), then the two together
    ws = derived.world_size(cfg.cluster)
    ranks = f"the job's {ws} rank{'s' * (ws != 1)} (cluster.nodes x tasks per node)"
    given = {key: getattr(p, key) for key in ("tensor", "pipeline") if getattr(p, key) != AUTO}
    for key, size in {**given, "context": p.context}.items():
        _require(ws % size == 0, f"parallel.{key}", f"{size} does not divide {ranks}")
    groups = m.num_query_groups or m.num_attention_heads
    _require(
        "tensor" not in given or m.num_attention_heads % p.tensor == 0 and groups % p.tensor == 0,
        "parallel.tensor",
        f"{p.tensor} does not divide the attention heads ({m.num_attention_heads}) "
        f"and query groups ({groups})",
    )
    _check_pipeline_split(cfg, "pipeline" in given)
    _require(
        "tensor" not in given or not p.sequence_parallel or p.tensor > 1,
        "parallel.sequence_parallel",
        "needs parallel.tensor > 1",
    )
    if len(given) == 2:
        _require(
            ws % (p.tensor * p.pipeline) == 0,
            "parallel.tensor",
            f"tensor x pipeline = {p.tensor * p.pipeline} does not divide {ranks}",
        )
        model_ranks = p.tensor * p.pipeline * p.context
        _require(
            ws % model_ranks == 0,
            "parallel.context",
            f"tensor x pipeline x context = {model_ranks} does not divide {ranks}",
        )


# Megatron's uneven split, by the layers it adds, named where a layer count the stages do not
# divide would split with it (the loss alone adds one as the embedding does)
_UNEVEN_SPLITS = (
    (1, "parallel.account_for_embedding=true"),
    (2, "parallel.account_for_embedding=true parallel.account_for_loss=true"),
)


def _check_pipeline_split(cfg: PipelineConfig, pipeline_given: bool) -> None:
    """The layers, with the embedding and loss where they count as layers, split evenly over
    the pipeline ranks and their virtual stages (megatron-core's rule for either split)."""
    p, m = cfg.parallel, cfg.model
    if not pipeline_given:  # the planner chooses the pipeline, then this is checked again
        return
    accounted = [k for k in ("account_for_embedding", "account_for_loss") if getattr(p, k)]
    stages = p.pipeline * (p.virtual_pipeline or 1)
    units = m.num_layers + len(accounted)
    if units % stages == 0:
        return
    if accounted:
        counted = " and ".join(k.removeprefix("account_for_") for k in accounted)
        raise ConfigError(
            f"parallel.pipeline: model.num_layers={m.num_layers} with the {counted} counted as "
            f"layers ({units}) is not divisible by pipeline x virtual stages = {stages}"
        )
    fixes = [keys for extra, keys in _UNEVEN_SPLITS if (units + extra) % stages == 0]
    hint = f"; uneven first and last stages split it: {fixes[0]}" if fixes else ""
    raise ConfigError(
        f"parallel.pipeline: model.num_layers={m.num_layers} is not divisible by pipeline x "
        f"virtual stages = {stages}{hint}"
    )
