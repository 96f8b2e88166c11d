"""`python -m pipeline`: check what the run needs, print the plan, then run or submit every
step that is not complete yet, holding the run folder's lock."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pipeline import config
from pipeline.config import PipelineConfig
from pipeline.core import files
from pipeline.core.lock import run_lock
from pipeline.core.paths import RunPaths
from pipeline.core.steps import Placement
from pipeline.data.datasets import vocab_size
from pipeline.orchestration import executors, graph
from pipeline.planning import preflight, render

SHARED = ("corpus", "tokenizer", "data")  # what a run with data.prepared takes from another


def launch(cfg: PipelineConfig) -> int:
    """Refuse what cannot work, then run or submit the pending steps; print where it all went.
    A dry run prints what it would run or submit, and writes nothing."""
    preflight.check_stage_inputs(cfg)
    if "train" in cfg.stages:  # refuse what would fail after hours in the queue
        preflight.check_training(cfg, vocab_size(cfg)[0])
    if cfg.dry_run:
        _run_pending(cfg, prepare=False)
        return 0
    paths = RunPaths.of(cfg.workdir)
    with run_lock(paths.root):  # one launcher per run folder
        if cfg.data.prepared:
            _link_prepared_data(Path(cfg.data.prepared), paths)
        files.write_text(paths.config, config.to_yaml(cfg))
        _run_pending(cfg, prepare=True)
    print(f"\nRun folder: {paths.root}")
    if paths.summary.exists():
        print(f"Summary:    {paths.summary}")
        print(paths.summary.read_text())
    return 0


def _link_prepared_data(prepared: Path, paths: RunPaths) -> None:
    """The prepared run's corpus, tokenizer and data folders, linked into this run."""
    source = prepared.expanduser().resolve()
    for name in SHARED:
        link = paths.root / name
        if not link.exists() and (source / name).exists():
            os.symlink(source / name, link)


def _run_pending(cfg: PipelineConfig, prepare: bool) -> None:
    if "train" in cfg.stages:  # the plan, before anything is submitted
        for line in render.summary_lines(cfg, vocab_size(cfg)[0]):
            print(line, file=sys.stderr)
    if prepare:  # cheap work that fixes the size of an array (the built-in corpus, shard plan)
        for step in graph.steps(cfg):
            if step.placement is Placement.ARRAY:
                step.prepare(cfg)
    todo = graph.pending(cfg)
    done = [step.name for step in graph.steps(cfg) if step not in todo]
    if done:
        print(f"[pipeline] already complete: {', '.join(done)}", file=sys.stderr)
    executors.select(cfg).run(todo, cfg)
