"""`python -m pipeline.status workdir=...` (`make status`): each step's state, from its
completion marker, what it was made from and, for submitted jobs, from Slurm. The run's
settings and stages come from its history (runs.jsonl), with any overrides given here on top: a
change shows what a rerun with it would do. Exits 1 when a step failed or would be refused, 2 when the
folder holds no run."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from pipeline import cli, config, usage
from pipeline.config import PipelineConfig
from pipeline.core import log
from pipeline.core.errors import ConfigError
from pipeline.core.paths import RunPaths
from pipeline.orchestration.status import describe, is_failed


def show(cfg: PipelineConfig) -> int:
    paths = RunPaths.of(cfg.workdir)
    if not paths.runs.exists():
        if not paths.config.exists():
            raise ConfigError(f"workdir: {paths.root} holds no run (no runs.jsonl, no config.yaml)")
        cfg = config.read(paths.config)  # a run folder of an earlier version
    rows = describe(cfg)
    print(f"Run folder: {paths.root}")
    width = max(len(r[0]) for r in rows)
    for name, state, detail in rows:
        print(f"  {name:<{width}}  {state:<13}  {detail}")
    return 1 if any(is_failed(state) for _, state, _ in rows) else 0


@hydra.main(config_path=cli.CONF, config_name="config", version_base=None)
def main(composed: DictConfig) -> None:
    cli.run(composed, show, replay=cli.given(), last_stages=True)


if __name__ == "__main__":
    log.take_quiet(sys.argv)  # -q: warnings and errors only
    usage.answer_help("pipeline.status", sys.argv[1:])
    sys.argv[1:] = cli.check_overrides(sys.argv[1:])
    main()
