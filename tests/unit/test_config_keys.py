"""Each config key's story on its schema field: every key has one, every key the package names
exists, and a key added with its field alone is treated right by validation, provenance, reruns
and the run's history, with no list elsewhere to edit."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import re
import tokenize
import typing
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pipeline.config import STAGES, ConfigError, PipelineConfig, TrainConfig, keys, rules, to_yaml
from pipeline.config.checks import check, check_across_keys
from pipeline.config.keys import Choice, Role, key
from pipeline.config.renames import RENAMED
from pipeline.config.rules import AT_LEAST_ONE, POSITIVE
from pipeline.config.schema import SourceConfig
from pipeline.orchestration import history
from pipeline.training.steps import TRAIN
from pipeline.usage import common_keys
from tests.conftest import ROOT, make_config

SECTIONS = sorted(
    {leaf.name.split(".")[0] for leaf in keys.leaves(PipelineConfig) if "." in leaf.name}
)
# A dotted word in a string of the package that starts with a section's name: "train.lr"
DOTTED = re.compile(rf"(?<![\w./-])(?:{'|'.join(SECTIONS)})\.[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
FILE_NAME = re.compile(r"\.(json|jsonl|pt|safetensors|model|txt|log|yaml)$")
NOT_KEYS = {
    "train.validation_samples",  # a provenance entry derived from train.eval_samples
    "train.stepz",  # the typo of an example
}
HUGGING_FACE_TENSORS = ("model.layers", "model.embed_tokens", "model.norm", "model.KEY")


def test_every_leaf_key_tells_its_role_and_help():
    for leaf in keys.leaves(PipelineConfig):
        assert leaf.info is not None, f"{leaf.name}: declare it with key(...) and its role"
        assert isinstance(leaf.info.role, Role) and leaf.info.help, leaf.name
        if leaf.info.command:  # what to run and where never changes what a run made
            assert leaf.info.role is Role.NOT_SETTING, leaf.name
        if leaf.choices is not None:  # members hash and compare as their strings
            assert all(m.name == m.value for m in leaf.type), leaf.name
    with pytest.raises(TypeError, match="give the key's role"):
        key(1, help="a key whose role was forgotten")


def _strings(path: Path) -> list[tuple[int, str]]:
    found = []
    for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if token.type == tokenize.STRING:
            text = token.string
            if re.match(r"[rRbB]?[fF]", text):  # an f-string's expressions are code
                text = re.sub(r"\{[^{}]*\}", "", text)
            found.append((token.start[0], text))
    return found


def test_every_dotted_key_the_package_names_exists():
    unknown = []
    for path in sorted((ROOT / "pipeline").rglob("*.py")):
        for line, text in _strings(path):
            for name in DOTTED.findall(text):
                if FILE_NAME.search(name) or name in NOT_KEYS or name in RENAMED:
                    continue  # a renamed key's old name: its table's only
                if name.startswith(HUGGING_FACE_TENSORS):  # their tensors' names
                    continue
                if keys.leaf(PipelineConfig, name) is None:
                    unknown.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    assert unknown == []


def test_the_keys_a_training_is_made_from_are_the_settings_of_its_sections(tmp_path):
    cfg = make_config(tmp_path)
    recorded = set(TRAIN.made_from(cfg)["settings"])
    for section in ("model", "train"):
        for leaf in keys.leaves(getattr(cfg, section)):
            name = f"{section}.{leaf.name}"
            setting = leaf.info.role is not Role.NOT_SETTING
            assert (name in recorded) == (setting and name != "train.eval_samples"), name
    assert "train.validation_samples" in recorded  # train.eval_samples, as sequences


def test_a_choice_is_one_line_naming_the_key_and_reads_back_as_its_string(tmp_path):
    with pytest.raises(ConfigError, match=r"^train.precision: 'fp9' is not one of fp32, bf16, "):
        make_config(tmp_path, "train.precision=fp9")
    cfg = make_config(tmp_path, "train.precision=fp8", "model.normalization=LayerNorm")
    assert cfg.train.precision == "fp8" and f"{cfg.train.precision}" == "fp8"
    assert {"bf16": 1, "fp8": 2}[cfg.train.precision] == 2
    assert "precision: fp8\n" in to_yaml(cfg)
    assert TRAIN.made_from(cfg)["settings"]["model.normalization"].__class__ is str


# A switch of the next features, planted as a subclass: its field is all there is of it.
@dataclass
class PlantedTrain(TrainConfig):
    fused_widget: bool = key(False, Role.NOT_SETTING, "a kernel that computes the same model")
    widget_chunks: int = key(4, Role.NOT_SETTING, "chunks of the kernel", rule=AT_LEAST_ONE)
    widget_kind: WidgetKind = key("plain", Role.NOT_SETTING, "the kernel's variant")
    widget_scale: float = key(1.0, Role.OUTPUT, "changes the model", rule=POSITIVE)


class WidgetKind(Choice):
    plain = "plain"
    fancy = "fancy"


@dataclass
class PlantedConfig(PipelineConfig):
    train: PlantedTrain = field(default_factory=PlantedTrain)


def planted(cfg: PipelineConfig, **values) -> PlantedConfig:
    train = PlantedTrain(**dataclasses.asdict(cfg.train), **values)
    kept = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "train"}
    return PlantedConfig(**kept, train=train)


def test_a_switch_added_by_its_schema_field_alone_is_treated_right(tmp_path):
    cfg = make_config(tmp_path, "train.steps=20", "train.warmup_steps=2")
    before = TRAIN.made_from(cfg)
    for values in ({}, {"fused_widget": True}, {"widget_kind": "fancy", "widget_chunks": 2}):
        now = planted(cfg, **values)
        check(now)
        # not settings: a run made before they existed, or with them changed, resumes as it is
        made = TRAIN.made_from(now)
        assert made["settings"].pop("train.widget_scale") == 1.0  # the one that is a setting
        assert made == before
    # a setting that changes the model is recorded; changed, the training is refused
    scaled = TRAIN.made_from(planted(cfg, widget_scale=2.0))
    assert scaled["settings"]["train.widget_scale"] == 2.0
    assert TRAIN.change(TRAIN.made_from(planted(cfg)), scaled).value == "refuse"
    # its rule and its choices are checked, in one line naming it
    with pytest.raises(ConfigError, match=r"^train.widget_chunks: 0 must be at least 1$"):
        check(planted(cfg, widget_chunks=0))
    with pytest.raises(ConfigError, match=r"^train.widget_kind: 'odd' is not one of plain, fancy"):
        check(planted(cfg, widget_kind="odd"))
    # a setting of the run's outputs, kept in its history and replayed by a rerun
    assert history.settings_overrides(["train.fused_widget=true", "cluster.nodes=2"]) == [
        "train.fused_widget=true"
    ]


@pytest.mark.parametrize("given", ["data.split=[98,1,1]", "data.split='98,1,1'"])
def test_the_split_is_parsed_once_from_its_string_or_list_form(given, tmp_path):
    cfg = make_config(tmp_path, given)
    assert cfg.data.split == "98,1,1" and cfg.data.split.weights == (98.0, 1.0, 1.0)
    assert "split: 98,1,1\n" in to_yaml(cfg)  # the run's config.yaml, as before
    with pytest.raises(ConfigError, match=r"^data.split: needs 3 weights >= 0$"):
        make_config(tmp_path, "data.split=[90,5]")


def with_value(cfg, name: str, value):
    """A copy of `cfg` with the dotted key `name` set to `value`."""
    head, _, rest = name.partition(".")
    inner = value if not rest else with_value(getattr(cfg, head), rest, value)
    return dataclasses.replace(cfg, **{head: inner})


def ruled_leaves() -> list[tuple[str, keys.Leaf]]:
    """(where it is planted, leaf) for every key that declares a rule; a mixture's source's
    keys are planted in a source named web."""
    found = [(leaf.name, leaf) for leaf in keys.leaves(PipelineConfig)]
    found += [(f"data.sources.web.{leaf.name}", leaf) for leaf in keys.leaves(SourceConfig)]
    return [(name, leaf) for name, leaf in found if leaf.info.rule is not None]


def planted_value(cfg: PipelineConfig, name: str, value) -> PipelineConfig:
    if name.startswith("data.sources.web."):
        source = with_value(SourceConfig(), name.removeprefix("data.sources.web."), value)
        return with_value(cfg, "data.sources", {"web": source})
    return with_value(cfg, name, value)


def refused_values(tmp_path: Path) -> dict[str, list]:
    """Values each rule refuses, by what the rule says (rules made by a factory, such as
    whole_or(AUTO), are one rule however often they are made)."""
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    return {
        rules.AT_LEAST_ONE.says: [0, -3],
        rules.at_least(64).says: [63],
        rules.NOT_NEGATIVE.says: [-1],
        rules.POSITIVE.says: [0, -1.5, math.inf],
        rules.FRACTION.says: [1.0, -0.1],
        rules.SHARE.says: [1.5],
        rules.PROBABILITY.says: [0.0, 1.01],
        rules.NOT_EMPTY.says: [""],
        rules.whole_or("auto").says: [0, "abc", True],
        rules.in_order(STAGES).says: [["train", "tokenize"], ["tokenise"]],
        rules.A_FILE.says: [str(tmp_path / "nowhere.model"), str(tmp_path)],
        rules.A_FOLDER.says: [str(tmp_path / "nowhere"), str(afile)],
        rules.FOLDER_TO_WRITE.says: ["", str(afile), str(afile / "run")],
        rules.PREPARED_RUN.says: [str(tmp_path)],
        rules.SLURM_TIME.says: ["soon", "0", "1:2:3:4"],
        rules.ROW_FILTER.says: ["score >>= 1", "score >= 1 or"],
        rules.SOURCE_FORMAT.says: ["parquet"],
        rules.SPLIT.says: ["0,5,5", "90,5"],
        rules.SOURCE_NAMES.says: [{"Web": SourceConfig()}, {"a b": SourceConfig()}],
        rules.EXTRA_SET_NAMES.says: [{"test2": "x.jsonl"}, {"a/b": "x.jsonl"}],
        rules.SBATCH_OPTIONS.says: [{"bad name": "x"}, {"exclusive": False}],
        rules.ENVIRONMENT.says: [{"NCCL-IB": "x"}, {"HF_TOKEN": "x"}],
        rules.MOUNTS.says: [["/lustre"], ["/a:/b,/c:/d"]],
        rules.FOLDERS.says: [[str(tmp_path / "nowhere")], [str(afile)]],
        rules.TASK_METRIC.says: ["hellaswag", "hellaswag/", "a/b/c"],
    }


def test_every_rule_refuses_a_planted_value_in_one_line_naming_its_key(tmp_path):
    cfg = make_config(tmp_path / "run")
    check(cfg)
    bad = refused_values(tmp_path)
    for name, leaf in ruled_leaves():
        says = leaf.info.rule.says
        assert says in bad, f"{name}: give values its rule ({says!r}) refuses, for this test"
        for value in bad[says]:
            with pytest.raises(ConfigError) as refused:
                check(planted_value(cfg, name, value))
            message = str(refused.value)
            assert message.startswith((f"{name}: ", f"{name}.")), (name, value, message)
            assert "\n" not in message, message


def test_help_shows_each_common_keys_rule_beside_its_help():
    lines = {line.split()[0]: line for line in common_keys().splitlines()}
    for name, leaf in ruled_leaves():
        if leaf.info.common:
            assert lines[name].endswith(f"{leaf.info.help} ({leaf.info.rule.says})"), name


# The keys the checks across keys name, each with what it is checked against. Any other
# refusal of one key's value comes from its own field (choices, rule, script values).
ACROSS_KEYS = {
    "data.inputs": "read when stages has tokenize; not with data.sources",
    "data.split": "validation and test shares when stages train and evaluate",
    "data.where": "no row filter on text files (data.format)",
    "tokenizer.vocab_size": "more than the fixed pieces of the tokenizer.* keys",
    "model.hidden_size": "divisible by model.num_attention_heads",
    "model.num_query_groups": "divides model.num_attention_heads",
    "model.seq_length": "up to model.max_position_embeddings",
    "model.init_from": "holds a tokenizer.model unless one is given",
    "model.add_bias_linear": "experts take biases at expert-tensor-parallel size 1 alone",
    "model.moe.top_k": "up to model.moe.experts; like every MoE key, unset in a dense model",
    "model.moe.ffn_hidden_size": "unset in a dense model (model.moe.experts=0)",
    "model.moe.shared_expert_ffn_hidden_size": "unset in a dense model",
    "model.moe.router": "unset in a dense model",
    "model.moe.aux_loss_coeff": "unset in a dense model or with router=aux_loss_free",
    "model.moe.z_loss_coeff": "unset in a dense model",
    "model.moe.capacity_factor": "unset in a dense model",
    "model.moe.first_dense_layers": "below model.num_layers; unset in a dense model",
    "parallel.expert": "divides the experts and the data-parallel size",
    "parallel.expert_tensor": "with expert and pipeline, divides the world size",
    "parallel.tensor": "divides the world size and the heads",
    "parallel.pipeline": "divides model.num_layers with the virtual stages",
    "parallel.sequence_parallel": "needs parallel.tensor > 1",
    "train.micro_batch_size": "the batch arithmetic",
    "train.global_batch_size": "the batch arithmetic",
    "train.grad_accum": "the batch arithmetic",
    "train.warmup_steps": "below train.steps",
    "train.min_lr": "up to train.lr",
    "train.eval_iters": "an earlier version's key, refused in terms of the batch it meant",
    "train.profile_steps": "[first, last] within train.steps",
    "eval.checkpoint": "a folder, or one the training of this command makes",
    "eval.extra_sets": "their files are read when stages has evaluate",
    "eval.harness_every": "needs eval.harness_tasks and train.save_interval",
    "eval.select_by": "its task among eval.harness_tasks",
    "cluster.tasks_per_node": "one per GPU (cluster.gpus_per_node)",
    "cluster.executor": "one that runs on cluster.name",
    "cluster.container_mounts": "needs cluster.container_image",
    "stages": "no tokenize with data.prepared",
}
PLAIN_VALUES = {
    int: [0, -1],
    float: [0.0, -1.0, math.nan],
    str: ["", "x y"],
    list: [[], [""]],
    dict: [{"a b": "x"}],
}


def test_a_value_refused_on_its_own_is_refused_by_its_field_not_by_a_check_written_by_hand(
    tmp_path,
):
    """Plain values planted in each key, one at a time: each is refused in one line or passes,
    and the checks across keys, run without the keys' own, never refuse one naming a key they
    do not check against others (a check of one key written by hand, instead of its field's
    rule, or besides it)."""
    cfg = make_config(tmp_path / "run")
    by_hand = []
    for leaf in keys.leaves(PipelineConfig):
        kind = next((k for k in PLAIN_VALUES if leaf.type in (k, k | None)), None)
        if typing.get_origin(leaf.type) in (list, dict):
            kind = typing.get_origin(leaf.type)
        for value in PLAIN_VALUES.get(kind, [0, "abc"] if leaf.type is typing.Any else []):
            planted = with_value(cfg, leaf.name, value)
            with contextlib.suppress(ConfigError):  # anything else fails the test
                check(planted)
            try:
                check_across_keys(planted)
            except ConfigError as e:
                named = str(e).startswith((f"{leaf.name}: ", f"{leaf.name}."))
                if named and leaf.name not in ACROSS_KEYS:
                    by_hand.append(f"{leaf.name}={value!r}: {e}")
            except Exception:  # noqa: S110 - a value its own field keeps out
                pass
    assert by_hand == [], "\n".join(by_hand)
