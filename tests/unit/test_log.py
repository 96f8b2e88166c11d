"""The pipeline's log: the lines users read stay as they were, -q and PIPELINE_LOG_LEVEL keep
only what matters, and a training's lines come from one rank."""

from __future__ import annotations

import re

import pytest

from pipeline.core import log


@pytest.fixture(autouse=True)
def _logging_rank(monkeypatch):
    monkeypatch.setenv(log.LEVEL, "INFO")  # restored after the test, whatever it sets
    monkeypatch.delenv(log.LEVEL)
    monkeypatch.setattr(log.RankFilter, "logs", True)


def test_lines_read_as_they_always_have(capsys):
    log.get("pipeline").info("train: running")
    log.get("plan").warning("warning: a.json is not JSONL")
    log.get().info("index cache: 12 train samples in 0.1 s")
    assert capsys.readouterr().err == (
        "[pipeline] train: running\n"
        "[plan] warning: a.json is not JSONL\n"
        "index cache: 12 train samples in 0.1 s\n"
    )


def test_quiet_keeps_warnings_and_errors(capsys, monkeypatch):
    argv = ["pipeline", "-q", "train.steps=3"]
    log.take_quiet(argv)
    assert argv == ["pipeline", "train.steps=3"]  # Hydra never sees it
    log.get("pipeline").info("train: running")
    log.get("plan").warning("warning: shown")
    assert capsys.readouterr().err == "[plan] warning: shown\n"
    monkeypatch.setenv(log.LEVEL, "DEBUG")
    log.get("pipeline").debug("details")
    line = capsys.readouterr().err
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ DEBUG rank=\S+ \[pipeline\] details\n", line
    )


def test_a_rank_that_does_not_log_keeps_only_its_warnings(capsys, monkeypatch):
    monkeypatch.setattr(log.RankFilter, "logs", False)
    log.get().info("step 10/40 | loss 7.80")
    log.get().error("error: rank 3 ran out of memory")
    assert capsys.readouterr().err == "error: rank 3 ran out of memory\n"
