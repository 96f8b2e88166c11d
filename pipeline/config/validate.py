"""Every cross-field check of the config, before anything is written or submitted.

The schema already refused unknown keys and wrong types at composition; this checks what a
schema cannot express (batch arithmetic, divisibility, ranges, paths, values that go into
scripts). It reads the config and never changes it: the first problem is a ConfigError whose
message starts with the key.
"""

from __future__ import annotations

import glob
import math
import os
import re
from pathlib import Path

from pipeline.config import derived, inputs, keys
from pipeline.config.keys import value_at
from pipeline.config.schema import AUTO, STAGES, PipelineConfig
from pipeline.config.split_weights import Split
from pipeline.core.errors import ConfigError

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD", re.IGNORECASE)


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def _one_of(cfg: PipelineConfig, key: str, allowed: tuple[str, ...]) -> None:
    value = value_at(cfg, key)
    _require(value in allowed, key, not_one_of(value, allowed))


def not_one_of(value: object, allowed: tuple[str, ...]) -> str:
    return f"{str(value)!r} is not one of {', '.join(allowed)}"


def validate(cfg: PipelineConfig) -> None:
    """Raise ConfigError for the first problem found."""
    _require(bool(cfg.workdir), "workdir", "must be a path")
    _folder_to_write(cfg.workdir, "workdir")
    _folder_to_write(cfg.export.out, "export.out")
    _validate_script_values(cfg)
    _validate_bounds(cfg)
    for stage in cfg.stages:
        _require(stage in STAGES, "stages", f"{stage!r} is not one of {', '.join(STAGES)}")
    _require(
        list(cfg.stages) == [s for s in STAGES if s in cfg.stages],
        "stages",
        f"must be in pipeline order ({', '.join(STAGES)})",
    )
    _validate_data(cfg)
    _validate_tokenizer(cfg)
    _validate_model(cfg)
    _validate_parallel(cfg)
    _validate_batch(cfg)
    _validate_train(cfg)
    _validate_cluster(cfg)
    _validate_eval(cfg)
    _validate_export(cfg)


def _validate_batch(cfg: PipelineConfig) -> None:
    """The micro-batch is a number or auto; the batch arithmetic holds once the values it
    needs are numbers (auto ones are chosen by the planner, then checked again)."""
    t = cfg.train
    micro = t.micro_batch_size
    _require(
        micro == AUTO or (isinstance(micro, int) and not isinstance(micro, bool)),
        "train.micro_batch_size",
        f"{micro!r} is not a whole number or auto",
    )
    _require(
        t.global_batch_size >= 1, "train.global_batch_size", f"{t.global_batch_size} must be >= 1"
    )
    if AUTO in (cfg.parallel.tensor, cfg.parallel.pipeline):
        gpus = derived.world_size(cfg.cluster)
        _require(  # data parallelism alone must be open to the planner
            t.global_batch_size % gpus == 0,
            "train.global_batch_size",
            f"{t.global_batch_size} does not split over the job's {gpus} GPUs; give a multiple "
            "of it, or give parallel.tensor and parallel.pipeline",
        )
    if AUTO in (micro, cfg.parallel.tensor, cfg.parallel.pipeline):
        return
    derived.batch(cfg)


def _validate_train(cfg: PipelineConfig) -> None:
    t = cfg.train
    _require(t.steps > 0, "train.steps", "must be positive")
    _require(
        0 <= t.warmup_steps < t.steps,
        "train.warmup_steps",
        f"{t.warmup_steps} must be in [0, train.steps={t.steps}): lower it with the steps",
    )
    _require(0 <= t.min_lr <= t.lr, "train.min_lr", f"{t.min_lr} must be in [0, train.lr={t.lr}]")
    for key in ("log_interval", "eval_interval"):
        _require(getattr(t, key) > 0, f"train.{key}", "must be positive")
    if t.eval_iters is not None:
        samples = ""
        if AUTO not in (t.micro_batch_size, cfg.parallel.tensor, cfg.parallel.pipeline):
            samples = f"={t.eval_iters * t.micro_batch_size * derived.data_parallel_size(cfg)}"
        raise ConfigError(
            "train.eval_iters: counts micro-batches, so runs with other micro-batch sizes would "
            f"validate on other sequences; give train.eval_samples{samples} (sequences) instead"
        )
    _require(t.save_interval >= 0, "train.save_interval", "must be >= 0 (0: no checkpoints)")
    _require(t.keep_last >= 1, "train.keep_last", "must be at least 1")
    ps = list(t.profile_steps)
    _require(
        not ps or (len(ps) == 2 and 1 <= ps[0] <= ps[1] <= t.steps),
        "train.profile_steps",
        f"{ps} is not [first, last] with 1 <= first <= last <= train.steps",
    )


def _validate_cluster(cfg: PipelineConfig) -> None:
    gpus, tasks = cfg.cluster.gpus_per_node, cfg.cluster.tasks_per_node
    _require(
        not gpus or not tasks or tasks == gpus,
        "cluster.tasks_per_node",
        f"{tasks} != cluster.gpus_per_node={gpus} (one task per GPU)",
    )
    allowed = ("inprocess", "subprocess") if cfg.cluster.name == "local" else ("slurm",)
    _one_of(cfg, "cluster.executor", allowed)
    for key in ("time_limit", "cpu_time_limit"):
        limit = getattr(cfg.cluster, key)
        _require(derived.slurm_minutes(limit, f"cluster.{key}") > 0, f"cluster.{key}", "is 0")
    _require(cfg.cluster.checkpoint_write_gbps > 0, "cluster.checkpoint_write_gbps", "must be > 0")


def _folder_to_write(path: str | None, key: str) -> None:
    """A folder the pipeline makes and writes into: neither a file nor under one."""
    if not path:
        return
    folder = Path(os.path.expanduser(path)).absolute()
    for existing in (folder, *folder.parents):
        if existing.exists():
            what = path if existing == folder else f"{path}: {existing}, in its path,"
            _require(existing.is_dir(), key, f"{what} is a file, not a folder")
            return


def _validate_eval(cfg: PipelineConfig) -> None:
    e = cfg.eval
    ckpt = str(e.checkpoint)
    named = ckpt not in ("best", "latest")
    _require(  # a folder a training of this command may still write is checked when read
        not named or os.path.isdir(ckpt) or ("train" in cfg.stages and not os.path.exists(ckpt)),
        "eval.checkpoint",
        f"{ckpt!r} is neither best, latest nor a checkpoint folder",
    )
    _require(e.max_batches is None or e.max_batches > 0, "eval.max_batches", "must be positive")
    if "evaluate" not in cfg.stages:
        return
    for name, pattern in e.extra_sets.items():
        key = f"eval.extra_sets.{name}"
        _require(re.fullmatch(r"[\w.-]+", name) is not None, key, "name a set with [A-Za-z0-9_.-]")
        _require(not name.startswith("test"), key, "'test...' names the held-out split's sets")
        matches = [p for p in glob.glob(os.path.expanduser(str(pattern))) if os.path.isfile(p)]
        _require(bool(matches), key, f"{pattern!r} matches no file")
        for path in matches:
            _require(os.access(path, os.R_OK), key, f"{path} is not readable")


def _validate_export(cfg: PipelineConfig) -> None:
    _require(cfg.export.shard_gb > 0, "export.shard_gb", "must be > 0")


def _refuse_empty(paths: list[str], key: str) -> None:
    """Files that hold not one byte: found here, before a run folder is made for them."""
    if paths and all(os.path.getsize(p) == 0 for p in paths):
        named = paths[0] if len(paths) == 1 else f"all {len(paths)} files ({paths[0]}, ...)"
        raise ConfigError(f"{key}: {named} {'is' if len(paths) == 1 else 'are'} empty")


def _validate_sources(cfg: PipelineConfig) -> None:
    d = cfg.data
    _require(
        not (d.inputs and d.sources), "data.inputs", "give data.inputs or data.sources, not both"
    )
    owner: dict[tuple[int, int], str] = {}
    for name, source in d.sources.items():
        key = f"data.sources.{name}"
        _require(
            re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,63}", name) is not None,
            key,
            "name a source with lower-case letters, digits, _ and - (it names files and metrics)",
        )
        _require(math.isfinite(source.weight) and source.weight > 0, f"{key}.weight", "must be > 0")
        _require(source.text_key != "", f"{key}.text_key", "must not be empty")
        inputs.check_reading(key, source.format, source.where)
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


def _validate_data(cfg: PipelineConfig) -> None:
    d = cfg.data
    _require(d.num_shards >= 1, "data.num_shards", "must be at least 1")
    _require(bool(d.text_key), "data.text_key", "must not be empty")
    inputs.check_reading("data", d.format, d.where)
    _require(d.warn_epochs > 0, "data.warn_epochs", "must be > 0")
    _require(d.max_epochs > 0, "data.max_epochs", "must be > 0")
    fraction = d.max_reject_fraction
    _require(0 <= fraction <= 1, "data.max_reject_fraction", f"{fraction} must be in [0, 1]")
    if d.prepared:
        manifest = os.path.join(os.path.expanduser(d.prepared), "data", "manifest.json")
        _require(os.path.isfile(manifest), "data.prepared", f"{manifest} does not exist")
        _require("tokenize" not in cfg.stages, "stages", "drop tokenize when data.prepared is set")
    _validate_sources(cfg)
    if "tokenize" in cfg.stages and d.inputs:
        found = [p for pattern in d.inputs for p in inputs.readable_files(pattern, "data.inputs")]
        _refuse_empty(found, "data.inputs")
    weights = Split.of(d.split).weights
    _require(weights[0] > 0, "data.split", "the training weight must be positive")
    _require(weights[1] > 0 or "train" not in cfg.stages, "data.split", "needs a validation share")
    _require(weights[2] > 0 or "evaluate" not in cfg.stages, "data.split", "needs a test share")


def _validate_tokenizer(cfg: PipelineConfig) -> None:
    tk = cfg.tokenizer
    if tk.model:
        _require(os.path.isfile(tk.model), "tokenizer.model", f"{tk.model} is not a file")
    _require(tk.vocab_size >= 64, "tokenizer.vocab_size", "must be at least 64")
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
    _require(0 < tk.character_coverage <= 1, "tokenizer.character_coverage", "must be in (0, 1]")


def _validate_model(cfg: PipelineConfig) -> None:
    m = cfg.model
    for key in ("num_layers", "hidden_size", "num_attention_heads", "seq_length"):
        _require(getattr(m, key) > 0, f"model.{key}", "must be positive")
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
    _require(
        m.make_vocab_size_divisible_by >= 1,
        "model.make_vocab_size_divisible_by",
        "must be at least 1 (the vocabulary is padded to a multiple of it x parallel.tensor)",
    )
    if m.init_from:
        _require(os.path.isdir(m.init_from), "model.init_from", f"{m.init_from} is not a folder")
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


def _validate_parallel(cfg: PipelineConfig) -> None:
    p, m = cfg.parallel, cfg.model
    for key in ("tensor", "pipeline"):
        value = getattr(p, key)
        number = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        _require(value == AUTO or number, f"parallel.{key}", f"{value!r} is not >= 1 or auto")
    if AUTO in (p.tensor, p.pipeline):  # chosen by the planner, then checked again
        return
    ws = derived.world_size(cfg.cluster)
    _require(
        ws % (p.tensor * p.pipeline) == 0,
        "parallel.tensor",
        f"tensor x pipeline = {p.tensor * p.pipeline} does not divide the world size {ws} "
        f"(cluster.nodes x cluster.gpus_per_node)",
    )
    groups = m.num_query_groups or m.num_attention_heads
    _require(
        m.num_attention_heads % p.tensor == 0 and groups % p.tensor == 0,
        "parallel.tensor",
        f"{p.tensor} does not divide the attention heads ({m.num_attention_heads}) "
        f"and query groups ({groups})",
    )
    stages = p.pipeline * (p.virtual_pipeline or 1)
    _require(
        m.num_layers % stages == 0,
        "parallel.pipeline",
        f"model.num_layers={m.num_layers} is not divisible by pipeline x virtual stages = {stages}",
    )
    _require(
        not p.sequence_parallel or p.tensor > 1,
        "parallel.sequence_parallel",
        "needs parallel.tensor > 1",
    )


def _validate_bounds(cfg: PipelineConfig) -> None:
    """Numbers the schema types accept but the stages cannot use (a zero that would divide,
    a negative size, a rate out of range), and a value that is not one of a key's choices
    (set by code, not composed): refused here rather than failing inside a job. Each key's
    bound and choices are on its schema field."""
    for leaf in keys.leaves(cfg):
        value = value_at(cfg, leaf.name)
        allowed = leaf.choices
        if allowed is not None:
            _require(value in allowed, leaf.name, not_one_of(value, allowed))
        bound = leaf.info.bound if leaf.info is not None else None
        if bound is not None and value is not None:
            _require(bound.holds(value), leaf.name, f"{value} {bound.value}")
    top_p = cfg.eval.top_p
    _require(0 < top_p <= 1, "eval.top_p", f"{top_p} must be in (0, 1]")


# Control characters: a newline would end an #SBATCH line and start a shell command.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SBATCH_OPTION = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NO_CONTROL = "must not contain a newline or other control character (it goes into a script)"


def _validate_script_values(cfg: PipelineConfig) -> None:
    """Config values that end up in the sbatch scripts submitit writes. submitit quotes each
    value for the shell, so `x; rm -rf ~` stays one harmless word, but no quoting survives a
    newline. The keys whose values go into scripts say so on their schema fields (the
    workdir is in every job's log paths and command line, most cluster keys become options);
    cluster.setup lines are shell by design: they run as written, like a site's module loads."""
    for name, value in cfg.cluster.sbatch_extra.items():
        valid = bool(_SBATCH_OPTION.fullmatch(str(name)))
        _require(valid, "cluster.sbatch_extra", f"{str(name)!r} is not an sbatch option name")
        key = f"cluster.sbatch_extra.{name}"
        _require(
            isinstance(value, (str, int, float)) and value is not False,
            key,
            f"{value!r} must be a string, a number or true (a flag)",
        )
    for name in cfg.cluster.env:
        valid = bool(_ENV_NAME.fullmatch(str(name)))
        _require(valid, "cluster.env", f"{str(name)!r} is not an environment variable name")
        # config.yaml, the job scripts and the trackers would hold it; jobs inherit the
        # environment of the command that submits them
        plain = not _SECRET_NAME.search(str(name))
        _require(plain, f"cluster.env.{name}", "a secret? export it in the shell instead")
    for leaf in keys.leaves(cfg):
        if leaf.info is None or not leaf.info.script:
            continue
        value = value_at(cfg, leaf.name)
        named = value.items() if isinstance(value, dict) else [(None, value)]
        for name, item in named:
            key = leaf.name if name is None else f"{leaf.name}.{name}"
            for text in item if isinstance(item, list) else [item]:
                _require(text is None or not _CONTROL.search(str(text)), key, _NO_CONTROL)
    image = cfg.cluster.container_image
    for mount in cfg.cluster.container_mounts:
        _require(
            ":" in mount and "," not in mount,
            "cluster.container_mounts",
            f"{mount!r} is not SRC:DST[:FLAGS] (one mount per list item)",
        )
    _require(
        image is not None or not cfg.cluster.container_mounts,
        "cluster.container_mounts",
        "needs cluster.container_image (the mounts are the container's)",
    )
