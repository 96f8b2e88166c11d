"""What outputs are made from, and what a rerun does with them: the history of a run's
overrides, the differences named in a refusal, which training changes can continue, and the
folder of a sweep point."""

from __future__ import annotations

import pytest

from pipeline.config.compose import sweep_point_folder
from pipeline.core import files, provenance
from pipeline.core.paths import RunPaths
from pipeline.core.steps import Change
from pipeline.evaluation.steps import EVALUATE
from pipeline.orchestration import history, reruns
from pipeline.training.steps import TRAIN
from tests.conftest import changed, make_config


def test_a_rerun_keeps_the_runs_overrides_but_those_it_gives_again():
    earlier = ["data.split='98,1,1'", "train.steps=20", "model=gpt-125m", "model.num_layers=2"]
    given = ["workdir=/runs/a", "stages=[evaluate]", "train.steps=30", "cluster=slurm"]
    given += ["parallel.tensor=2", "train.device=cpu"]  # where and how: this command's own
    assert history.combined(earlier, history.settings_overrides(given)) == [
        "data.split='98,1,1'",
        "model=gpt-125m",
        "model.num_layers=2",
        "train.steps=30",
    ]
    # a group given again keeps what was set inside it before, as a replay would
    assert history.combined(earlier, ["model=gpt-350m"]) == [
        "data.split='98,1,1'",
        "train.steps=20",
        "model.num_layers=2",
        "model=gpt-350m",
    ]
    assert history.key_of("+eval.extra_sets.code=/data/*.jsonl") == "eval.extra_sets.code"
    assert history.key_of("~eval.prompts") == "eval.prompts"


def test_differences_name_each_key_with_its_recorded_and_new_value():
    recorded = provenance.made_from({"train.lr": 0.003, "train.steps": 20}, verify="a1")
    now = provenance.made_from({"train.lr": 0.001, "train.steps": 20}, verify="b2")
    found = provenance.differences(recorded, now)
    assert found == [("train.lr", 0.003, 0.001), ("input verify", "a1", "b2")]
    assert provenance.describe(found[:1]) == "train.lr=0.003 (now 0.001)"
    assert provenance.fingerprint(recorded) == provenance.fingerprint(dict(recorded))
    assert provenance.fingerprint(recorded) != provenance.fingerprint(now)


@pytest.mark.parametrize(
    "section,values,change",
    [
        ("train", {"steps": 40}, Change.CONTINUE),
        ("train", {"steps": 40, "save_interval": 5, "eval_interval": 5}, Change.CONTINUE),
        ("train", {"nonfinite": "stop"}, Change.CONTINUE),
        ("train", {"micro_batch_size": 2}, None),  # the same training: nothing differs
        ("train", {"steps": 10}, Change.REFUSE),
        ("train", {"steps": 40, "lr": 1e-3}, Change.REFUSE),
        ("train", {"eval_samples": 32}, Change.REFUSE),
        ("model", {"num_layers": 2}, Change.REFUSE),
    ],
)
def test_a_training_continues_only_for_more_steps_or_other_intervals(
    tmp_path, section, values, change
):
    cfg = make_config(tmp_path, "train.steps=20", "train.warmup_steps=2")
    recorded, now = TRAIN.made_from(cfg), TRAIN.made_from(changed(cfg, section, **values))
    if change is None:
        assert recorded == now
    else:
        assert TRAIN.change(recorded, now) is change


# the key added after 0.6 to what a training is made from; its default does what 0.6 did
ADDED = ("train.max_skipped_in_a_row",)


def without_added(record: dict) -> dict:
    """The record as 0.6 wrote it."""
    settings = {k: v for k, v in record["settings"].items() if k not in ADDED}
    return {**record, "settings": settings}


def test_a_key_a_record_does_not_name_is_compared_as_its_default(tmp_path):
    cfg = make_config(tmp_path, "train.steps=20", "train.warmup_steps=2")
    default = provenance.defaults(cfg)
    now, older = TRAIN.made_from(cfg), without_added(TRAIN.made_from(cfg))
    assert provenance.differences(older, now, default) == []
    assert provenance.same(older, now, default)
    given = TRAIN.made_from(changed(cfg, "train", max_skipped_in_a_row=5))
    found = provenance.differences(older, given, default)
    assert found == [("train.max_skipped_in_a_row", 10, 5)]
    assert TRAIN.change(older, given) is Change.CONTINUE
    # a value the record names is compared as it is, default or not
    other = {**now, "settings": {**now["settings"], "train.max_skipped_in_a_row": 5}}
    found = provenance.differences(other, now, default)
    assert found == [("train.max_skipped_in_a_row", 5, 10)]
    assert not provenance.same(other, now, default)


def test_a_finished_run_of_an_earlier_version_is_complete_when_new_keys_keep_their_defaults(
    tmp_path,
):
    """A run folder whose training and evaluation recorded neither new key: its rerun neither
    trains nor evaluates again, unless a new key is given another value."""
    cfg = make_config(tmp_path, "train.steps=20", "train.warmup_steps=2")
    paths = RunPaths.of(cfg.workdir)
    trained = without_added(TRAIN.made_from(cfg))
    files.write_json(paths.train_done, {"made_from": trained})
    evaluated = EVALUATE.made_from(cfg)
    evaluated["inputs"]["train"] = provenance.fingerprint(trained)  # the training it measured
    files.write_json(paths.eval_done, {"made_from": evaluated})

    states = {v.step.name: v.state for v in reruns.judge(cfg)}
    assert (states["train"], states["evaluate"]) == ("complete", "complete")
    assert TRAIN.is_complete(cfg) and EVALUATE.is_complete(cfg)

    more = changed(cfg, "train", max_skipped_in_a_row=3)
    verdicts = {v.step.name: v for v in reruns.judge(more)}
    assert verdicts["train"].state == "continue"
    assert verdicts["train"].differences == [("train.max_skipped_in_a_row", 10, 3)]
    assert verdicts["evaluate"].state == "redo"


def test_a_sweep_point_is_named_by_its_overrides():
    one = sweep_point_folder("train.lr=0.001,workdir=/runs/base")
    assert one == sweep_point_folder("train.lr=0.001,workdir=/runs/base")
    assert one != sweep_point_folder("train.lr=0.003,workdir=/runs/base")
