"""Checkpoints under faults: a byte altered on disk is detected and
skipped, the previous whole checkpoint is loaded and the loss curve goes on as if nothing
happened; retention never deletes anything outside the run folder."""

from __future__ import annotations

import shutil

import pytest

from pipeline.config import PipelineConfig
from pipeline.core.paths import RunPaths
from pipeline.training import checkpoint
from pipeline.training.steps import TRAIN
from tests.conftest import SMALL, changed, copy_tokenized, loss_curve, make_config


@pytest.fixture(scope="module")
def trained(tokenized, tmp_path_factory) -> PipelineConfig:
    """The tokenized run trained to its end, its loss logged at every step."""
    workdir = copy_tokenized(tokenized, tmp_path_factory.mktemp("trained"))
    cfg = make_config(workdir, *SMALL, "train.log_interval=1")
    TRAIN.run(cfg)
    return cfg


@pytest.mark.parametrize("name", ["dist/__0_0.distcp", "dist/common.pt", "state.json"])
def test_a_flipped_byte_is_detected_and_the_previous_checkpoint_resumes(trained, tmp_path, name):
    shutil.copytree(trained.workdir, tmp_path / "run", symlinks=True)
    cfg = make_config(tmp_path / "run", *SMALL, "train.log_interval=1")
    uninterrupted = loss_curve(cfg.workdir)
    paths = RunPaths.of(cfg.workdir)
    damaged = paths.checkpoints / checkpoint.folder_name(20)
    data = bytearray((damaged / name).read_bytes())
    data[len(data) // 2] ^= 0x01  # same size: only the checksum can tell
    (damaged / name).write_bytes(bytes(data))
    assert checkpoint.problem(damaged) == f"{name} does not match its sha256 when saved"

    paths.train_done.unlink()
    with pytest.warns(UserWarning, match=f"iter_0000020: incomplete or damaged \\({name}"):
        resumed = TRAIN.run(cfg)
    assert resumed["status"] == "complete"
    assert loss_curve(cfg.workdir) == uninterrupted  # steps 11-20 again, bit for bit
    assert checkpoint.is_valid(damaged)  # saved again, whole


def test_retention_never_deletes_outside_the_run_folder(run_copy, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    victim = elsewhere / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    root = RunPaths.of(run_copy.workdir).checkpoints
    root.mkdir()
    (root / "iter_0000001").symlink_to(victim)  # an old checkpoint name, leading outside
    (root / "iter_0000002.partial").symlink_to(victim)
    (root / "iter_0000003.partial").mkdir()  # left by a killed save: ours to clear
    with pytest.warns(UserWarning, match="not deleting .*iter_0000001: it leads outside"):
        TRAIN.run(changed(run_copy, "train", keep_last=1))
    assert (victim / "precious").read_text() == "keep me"
    assert (root / "iter_0000001").is_symlink() and (root / "iter_0000002.partial").is_symlink()
    assert not (root / "iter_0000003.partial").exists()
    assert (root / checkpoint.folder_name(20)).is_dir()


def test_a_checkpoints_folder_linked_elsewhere_is_never_pruned(run_copy, tmp_path_factory):
    """The run's checkpoints go where the link leads, but retention deletes nothing there:
    the folder may be shared, and another run's checkpoints look just like ours."""
    elsewhere = tmp_path_factory.mktemp("scratch")
    theirs = elsewhere / "iter_0000005"
    theirs.mkdir()
    (theirs / "model.pt").write_text("another run's weights")
    RunPaths.of(run_copy.workdir).checkpoints.symlink_to(elsewhere)
    with pytest.warns(UserWarning, match="leads outside"):
        TRAIN.run(changed(run_copy, "train", keep_last=1, steps=30))
    assert (theirs / "model.pt").read_text() == "another run's weights"
    assert sorted(p.name for p in elsewhere.glob("iter_*")) == [
        "iter_0000005",
        "iter_0000010",
        "iter_0000020",
        "iter_0000030",
    ]
