"""A run folder a team can share: every file and folder the pipeline writes (markers, configs,
the manifest, shards, the tokenizer, checkpoints, reports, logs, the exported model) gets the permissions the
user's umask gives, never private ones from a temporary file renamed into place."""

from __future__ import annotations

import os
import stat

from tests.conftest import SMALL_SERIAL, cli


def test_a_whole_run_written_under_umask_027_is_group_readable(tmp_path):
    workdir = tmp_path / "run"
    umask_027 = lambda: os.umask(0o027)  # noqa: E731
    every_stage = "stages=[tokenize,train,evaluate,export]"
    result = cli(f"workdir={workdir}", *SMALL_SERIAL, every_stage, preexec_fn=umask_027)
    assert result.returncode == 0, result.stderr[-3000:]
    wrong = {}
    for path in [workdir, *workdir.rglob("*")]:
        if path.is_symlink():
            continue
        mode = stat.S_IMODE(path.stat().st_mode)
        allowed = {0o750} if path.is_dir() else {0o640, 0o750}  # 750: an executable file
        if mode not in allowed:
            wrong[str(path.relative_to(workdir))] = oct(mode)
    assert wrong == {}
    checkpoints = list((workdir / "checkpoints").rglob("*.distcp"))
    assert checkpoints, "the run saved checkpoints"
    assert list((workdir / "export").glob("*.safetensors")), "the run exported its model"
