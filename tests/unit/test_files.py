"""Outputs written atomically get the permissions the user's umask gives any new file (a
temporary file is private until renamed: the rename must not keep it so)."""

from __future__ import annotations

import os
import stat

import pytest

from pipeline.core import files


@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_an_atomic_write_has_the_mode_of_the_users_umask(tmp_path, mask, mode):
    before = os.umask(mask)
    try:
        assert files.umask() == mask
        files.write_json(tmp_path / "marker.json", {"a": 1})
        (tmp_path / "plain").write_text("x")
    finally:
        os.umask(before)
    assert stat.S_IMODE((tmp_path / "marker.json").stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / "plain").stat().st_mode) == mode  # as open() makes it
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
