"""A run folder a team can share: every file and folder the pipeline writes (markers, configs,
the manifest, shards, the tokenizer, checkpoints, reports, logs, the exported model) gets the permissions the
user's umask gives, never private ones from a temporary file renamed into place."""

from __future__ import annotations

import stat


def test_a_whole_run_written_under_umask_027_is_group_readable(finished_run):
    """The session's whole run (tests/conftest.py) is made under umask 027, with the export."""
    workdir = finished_run.workdir
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
