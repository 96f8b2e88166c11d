"""Renamed keys (pipeline.config.renames): the old name still works on the command line, in a
YAML file, in a run folder's config.yaml and in the overrides its runs.jsonl recorded."""

from __future__ import annotations

import json

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from pipeline import config
from pipeline.config import ClusterConfig, PipelineConfig, keys, renames
from pipeline.config.compose import CONF, sweep_point_folder
from pipeline.config.keys import Role
from pipeline.config.renames import RENAMED
from pipeline.core.paths import RunPaths
from pipeline.orchestration import history
from tests.conftest import ROOT

OLD_RUN_CONFIG = ROOT / "tests" / "cli" / "run_of_0.2" / "config.yaml"


def test_each_new_name_is_a_key_that_no_marker_records_and_each_old_name_is_gone():
    for old, new in RENAMED.items():
        found = keys.leaf(PipelineConfig, new)
        assert found is not None and found.name == new, new
        # markers record only settings: a renamed setting would need its records renamed too
        assert found.info.role is Role.NOT_SETTING, new
        assert keys.leaf(PipelineConfig, old) is None, old


def test_an_override_gets_the_new_name_with_one_warning_for_each_old_one():
    said: list[str] = []
    given = ["train.max_requeues=5", "+cluster.spare_nodes=1", "train.steps=3", "~train.seed"]
    assert renames.overrides(given, said.append) == [
        "resilience.max_requeues=5",
        "+resilience.spare_nodes=1",
        "train.steps=3",
        "~train.seed",
    ]
    assert said == [
        "warning: train.max_requeues is now resilience.max_requeues; the old name still works, "
        "give the new one",
        "warning: cluster.spare_nodes is now resilience.spare_nodes; the old name still works, "
        "give the new one",
    ]
    assert renames.overrides(["cluster.hang_timeout_s=1,2"]) == ["resilience.hang_timeout_s=1,2"]


def test_a_yaml_file_that_sets_an_old_name_composes_into_the_new_key(tmp_path):
    config.register()
    old = ["cluster.hang_timeout_s=30", "train.max_failed_saves=4"]  # as a YAML file sets them
    with initialize_config_dir(config_dir=CONF, version_base=None):
        composed = compose("config", overrides=[f"workdir={tmp_path}", *old])
    said: list[str] = []
    moved = renames.moved(composed, PipelineConfig, said.append)
    assert [line.split()[1] for line in said] == [
        "cluster.hang_timeout_s",
        "train.max_failed_saves",
    ]
    cfg = config.typed(moved)
    assert (cfg.resilience.hang_timeout_s, cfg.resilience.max_failed_saves) == (30, 4)
    # the typed config, and the config.yaml written from it, have the new names only
    assert type(cfg) is PipelineConfig and type(cfg.cluster) is ClusterConfig
    typed = config.compose(tmp_path, *old, check=False)
    assert typed.resilience == cfg.resilience
    written = OmegaConf.create(config.to_yaml(typed))
    assert "hang_timeout_s" not in written.cluster and "max_failed_saves" not in written.train


def test_a_config_yaml_of_an_earlier_version_is_read_with_the_new_names(tmp_path):
    text = OLD_RUN_CONFIG.read_text().replace("max_requeues: 20", "max_requeues: 7")
    assert "  max_requeues: 7\n" in text and "resilience" not in text
    (tmp_path / "config.yaml").write_text(text)
    cfg = config.read(tmp_path / "config.yaml")
    assert (cfg.resilience.max_requeues, cfg.resilience.exit_signal_lead_s) == (7, 120)


def test_the_overrides_a_run_of_an_earlier_version_recorded_are_replayed_with_the_new_names(
    tmp_path,
):
    paths = RunPaths.of(tmp_path)
    record = {"overrides": ["train.steps=20", "train.max_failed_saves=4"], "stages": ["train"]}
    paths.runs.write_text(json.dumps(record) + "\n")
    assert history.recorded(paths) == ["train.steps=20", "resilience.max_failed_saves=4"]


def test_a_sweep_point_made_under_an_old_name_keeps_its_folder(tmp_path):
    # Hydra's override_dirname: the overrides sorted, joined by commas
    now = "resilience.max_failed_saves=2,train.lr=0.1,workdir=/runs/a"
    before = "train.lr=0.1,train.max_failed_saves=2,workdir=/runs/a"
    assert renames.earlier_dirname(now) == before
    assert renames.earlier_dirname("data.inputs=[a,b],train.lr=1") == "data.inputs=[a,b],train.lr=1"
    new, old = sweep_point_folder(now), sweep_point_folder(before)
    assert new != old and sweep_point_folder(now, str(tmp_path)) == new
    (tmp_path / old).mkdir()  # the point 0.6 made
    assert sweep_point_folder(now, str(tmp_path)) == old
    assert sweep_point_folder("train.lr=0.1", str(tmp_path)) == sweep_point_folder("train.lr=0.1")


def test_a_sweep_renames_an_old_name_before_hydra_sees_it():
    """The command line's renaming (cli.check_overrides applies it first, before the points
    are composed and checked) leaves Hydra's options and a sweep's values as they are."""
    from pipeline import cli

    assert cli.renamed(["-m", "train.max_requeues=1,2", "train.steps=5"]) == [
        "-m",
        "resilience.max_requeues=1,2",
        "train.steps=5",
    ]
