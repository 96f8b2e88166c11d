"""What a launch does with each step's existing output, judged by what the output records it
was made from (pipeline.core.provenance) against what the config asks for now:

    new         no output yet                                   run
    complete    made from exactly this                          skip
    incomplete  made from this, not finished (killed, say)      run: resume
    continue    made from this but for more train.steps, ...    run: carry on from it
    redo        made otherwise, nothing lost by redoing it      run: make it again
    refuse      made otherwise, and redoing would lose it or    refuse before anything is
                mislabel what comes after                       written, naming the keys
    forced      force=STEP: STEP and every step after it        outputs moved to replaced/

A step the command does not run is judged as an input of those it runs: whatever differs
there (but for a cache or an evaluation) is refused. Outputs written before markers recorded
what they were made from are taken as made from the run's config.yaml; a key a marker does not
name (added after the output was made) as its schema default.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline import config
from pipeline.config import PipelineConfig
from pipeline.core import provenance
from pipeline.core.errors import ConfigError
from pipeline.core.paths import RunPaths
from pipeline.core.steps import Change
from pipeline.orchestration import graph
from pipeline.orchestration.graph import Step

RUN = ("new", "incomplete", "continue", "redo", "forced")  # states that run a step of the stages


@dataclass(frozen=True)
class Verdict:
    step: Step
    state: str
    differences: list[tuple[str, Any, Any]] = field(default_factory=list)

    def describe(self) -> str:
        """The differences, for a line of the launcher or of `make status`."""
        settings = [d for d in self.differences if not d[0].startswith("input ")]
        inputs = [d[0].removeprefix("input ") for d in self.differences if d not in settings]
        said = [f"made with {provenance.describe(settings)}"] if settings else []
        if inputs:
            said.append(f"what it read changed ({', '.join(inputs)})")
        return "; ".join(said)


def _legacy_config(paths: RunPaths) -> PipelineConfig | None:
    """The run's config.yaml, for outputs whose markers do not say what they were made from."""
    return config.read(paths.config) if paths.config.exists() else None


def folder_of(step: Step, cfg: PipelineConfig) -> RunPaths:
    """The run folder that holds the step's output: the data's (data.prepared) for the steps
    of the tokenize stage, the run's own for the others."""
    data = graph.stage_of(step.name) == "tokenize" and cfg.data.prepared
    return RunPaths.of(cfg.data.prepared if data else cfg.workdir)


def judge(cfg: PipelineConfig) -> list[Verdict]:
    """A verdict for every step whose output exists or that this command runs, in order."""
    running = {step.name for step in graph.steps(cfg)}
    forced = _forced(cfg, running)
    legacy: dict[Path, PipelineConfig] = {}
    verdicts = []
    for step in graph.ALL_STEPS:
        if step.name in forced:
            verdicts.append(Verdict(step, "forced"))
            continue
        recorded = step.recorded(cfg)
        if recorded is None:
            if step.name in running:
                verdicts.append(Verdict(step, "new"))
            continue
        earlier = recorded == {}  # written before markers said what they were made from
        if earlier:
            folder = folder_of(step, cfg)
            if folder.root not in legacy:
                legacy[folder.root] = _legacy_config(folder) or cfg
            recorded = step.made_from(legacy[folder.root])
        now = step.made_from(cfg)
        found = provenance.differences(recorded, now, provenance.defaults(cfg))
        if not found:  # a key the record does not name is taken as its default
            done = earlier or step.is_complete(cfg)
            verdicts.append(Verdict(step, "complete" if done else "incomplete"))
            continue
        change = step.change(recorded, now)
        if step.name not in running and change is not Change.REDO:
            change = Change.REFUSE  # an input of what runs, made otherwise
        elif step.name not in running:
            continue  # a cache or an evaluation this command does not use
        state = {Change.CONTINUE: "continue", Change.REDO: "redo"}.get(change, "refuse")
        verdicts.append(Verdict(step, state, found))
    return verdicts


def _forced(cfg: PipelineConfig, running: set[str]) -> set[str]:
    """force=STEP: the names of STEP and every step after it."""
    if not cfg.force:
        return set()
    names = [step.name for step in graph.ALL_STEPS]
    if cfg.force not in names:
        raise ConfigError(f"force: {cfg.force!r} is not a step (the steps: {', '.join(names)})")
    if cfg.force not in running:
        raise ConfigError(
            f"force: {cfg.force} is not run by stages={list(cfg.stages)}; add "
            f"{graph.stage_of(cfg.force)} to stages"
        )
    return set(names[names.index(cfg.force) :])


def refuse_changes(cfg: PipelineConfig, verdicts: list[Verdict]) -> None:
    """One line for the first output that this command would otherwise lose or mislabel."""
    for verdict in verdicts:
        if verdict.state != "refuse":
            continue
        name = verdict.step.name
        stage = graph.stage_of(name)
        hint = "" if stage in cfg.stages else f" (with {stage} in stages)"
        raise ConfigError(
            f"{name}: its output in {folder_of(verdict.step, cfg).root} was {verdict.describe()}; "
            f"give the recorded value, use a new workdir, or force={name}{hint} to redo {name} "
            "and the steps after it"
        )


def move_aside(cfg: PipelineConfig, verdicts: list[Verdict]) -> Path | None:
    """force=STEP: the outputs of the forced steps moved into replaced/<time>/ (a rename,
    whatever their size; nothing is deleted). Returns that folder, if anything moved."""
    paths = RunPaths.of(cfg.workdir)
    outputs = [p for v in verdicts if v.state == "forced" for p in v.step.outputs(cfg)]
    present = [p for p in dict.fromkeys(outputs) if p.exists() or p.is_symlink()]
    if not present:
        return None
    folder = paths.replaced / time.strftime(f"%Y%m%d-%H%M%S-force-{cfg.force}")
    for path in present:
        target = folder / path.relative_to(paths.root)
        if not path.exists() and not path.is_symlink():
            continue  # inside a folder moved before it
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(path), str(target))
    return folder
