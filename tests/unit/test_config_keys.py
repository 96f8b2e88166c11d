"""Each config key's story on its schema field: every key has one, every key the package names
exists, and a key added with its field alone is treated right by validation, provenance, reruns
and the run's history, with no list elsewhere to edit."""

from __future__ import annotations

import dataclasses
import io
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pipeline.config import ConfigError, PipelineConfig, TrainConfig, keys, to_yaml
from pipeline.config.keys import Bound, Choice, Role, key
from pipeline.config.validate import validate
from pipeline.orchestration import history
from pipeline.training.steps import TRAIN
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
                if FILE_NAME.search(name) or name in NOT_KEYS:
                    continue
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
    widget_chunks: int = key(4, Role.NOT_SETTING, "chunks of the kernel", bound=Bound.AT_LEAST_ONE)
    widget_kind: WidgetKind = key("plain", Role.NOT_SETTING, "the kernel's variant")
    widget_scale: float = key(1.0, Role.OUTPUT, "changes the model", bound=Bound.POSITIVE)


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
        validate(now)
        # not settings: a run made before they existed, or with them changed, resumes as it is
        made = TRAIN.made_from(now)
        assert made["settings"].pop("train.widget_scale") == 1.0  # the one that is a setting
        assert made == before
    # a setting that changes the model is recorded; changed, the training is refused
    scaled = TRAIN.made_from(planted(cfg, widget_scale=2.0))
    assert scaled["settings"]["train.widget_scale"] == 2.0
    assert TRAIN.change(TRAIN.made_from(planted(cfg)), scaled).value == "refuse"
    # its bound and its choices are checked, in one line naming it
    with pytest.raises(ConfigError, match=r"^train.widget_chunks: 0 must be at least 1$"):
        validate(planted(cfg, widget_chunks=0))
    with pytest.raises(ConfigError, match=r"^train.widget_kind: 'odd' is not one of plain, fancy"):
        validate(planted(cfg, widget_kind="odd"))
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
