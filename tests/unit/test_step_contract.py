"""The step contract: every step of the graph is a pipeline.core.steps.Step, and a MarkedStep
states only what it makes and from what; the base class owns completion and rerunning."""

from __future__ import annotations

from pathlib import Path

from pipeline.core import files
from pipeline.core.steps import Change, MarkedStep, Placement, Step
from pipeline.orchestration import graph


def test_every_step_of_the_graph_keeps_the_contract():
    for step in graph.ALL_STEPS:
        assert isinstance(step, Step), step.name
    marked = {s.name for s in graph.ALL_STEPS if isinstance(s, MarkedStep)}
    assert marked == {"tokenizer", "verify", "index", "train", "downstream", "evaluate", "export"}


class Greeting(MarkedStep):
    """A step made of what it makes and from what: a file greeting a name."""

    name = "greeting"
    placement = Placement.CPU

    def __init__(self, folder: Path):
        self.folder = folder
        self.made = 0

    def made_from(self, cfg: dict) -> dict:
        return {"settings": {"greeting.name": cfg["name"]}, "inputs": {}}

    def marker(self, cfg: dict) -> Path:
        return self.folder / "DONE.json"

    def outputs(self, cfg: dict) -> list[Path]:
        return [self.folder]

    def make(self, cfg: dict, made_from: dict) -> dict:
        self.made += 1
        (self.folder / "hello.txt").write_text(f"hello {cfg['name']}\n")
        record = {"made_from": made_from, "greeted": cfg["name"]}
        files.write_json(self.marker(cfg), record)  # last: the output is whole
        return record


def test_a_marked_step_runs_once_per_what_it_is_made_from(tmp_path):
    step = Greeting(tmp_path)
    ada = {"name": "ada"}
    assert step.recorded(ada) is None and not step.is_complete(ada)
    assert step.run(ada)["greeted"] == "ada"
    assert step.is_complete(ada) and step.run(ada)["greeted"] == "ada"  # read back, not made
    assert step.made == 1
    bob = {"name": "bob"}
    assert not step.is_complete(bob)
    assert step.recorded(bob) == step.made_from(ada)  # what a rerun compares
    assert step.change(step.recorded(bob), step.made_from(bob)) is Change.REFUSE  # the default
    step.run(bob)
    assert step.made == 2 and (tmp_path / "hello.txt").read_text() == "hello bob\n"
