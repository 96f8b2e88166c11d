"""Ctrl-C outside training stops the command even where something swallows the
KeyboardInterrupt: a Ctrl-C landing in a C extension's first import (tqdm's, protobuf's,
sentencepiece's, as a tokenize task starts) fails that import as ImportError, which a library
falling back on ImportError takes for a missing package, and the run went on to exit 0."""

from __future__ import annotations

import os
import signal
import time

import pytest

from pipeline import cli
from pipeline.core import interrupts
from pipeline.core.steps import ArrayStep, Placement
from pipeline.orchestration.executors.inprocess import InProcessExecutor
from tests.conftest import make_config


@pytest.fixture(autouse=True)
def handlers(monkeypatch):
    """The test process's own handlers back afterwards, and nothing recorded."""
    before = {sig: signal.getsignal(sig) for sig in interrupts.STOPS}
    monkeypatch.setattr(interrupts, "_received", [])
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


def ctrl_c_swallowed_by_an_import_fallback() -> None:
    try:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises here, as in a C extension's initialisation
        except KeyboardInterrupt as e:
            raise ImportError("initialization failed") from e
    except ImportError:
        pass  # the library's pure-Python fallback


class TwoTasks(ArrayStep):
    name = "tokenize"
    placement = Placement.ARRAY

    def __init__(self) -> None:
        self.ran: list[int] = []

    def prepare(self, cfg) -> None:
        pass

    def tasks(self, cfg) -> int:
        return 2

    def run_task(self, cfg, index: int) -> None:
        self.ran.append(index)
        if index == 0:
            ctrl_c_swallowed_by_an_import_fallback()

    def made_from(self, cfg) -> dict:
        return {}

    def recorded(self, cfg) -> dict | None:
        return None

    def is_complete(self, cfg) -> bool:
        return False

    def outputs(self, cfg) -> list:
        return []


def test_a_swallowed_ctrl_c_stops_before_the_next_task(tmp_path):
    cfg = make_config(tmp_path, "cluster.cpus_per_task=64")  # one task after another
    step = TwoTasks()
    interrupts.install()
    with pytest.raises(KeyboardInterrupt):
        InProcessExecutor().run([step], cfg)
    assert step.ran == [0]


def test_a_command_that_swallowed_a_ctrl_c_exits_130_in_one_line(tmp_path, capfd):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=cli.CONF, version_base=None):
        composed = compose("config", overrides=[f"workdir={tmp_path}"])

    def command(cfg) -> int:
        ctrl_c_swallowed_by_an_import_fallback()
        return 0

    with pytest.raises(SystemExit) as exited:
        cli.run(composed, command)
    assert exited.value.code == cli.EXIT_INTERRUPTED
    assert capfd.readouterr().err == (
        "error: interrupted (Ctrl-C): complete outputs are kept; rerun the same command to go on\n"
    )
