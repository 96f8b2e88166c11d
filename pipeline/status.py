"""`python -m pipeline.status workdir=...` (`make status`): each step's state, from the
completion markers and, for submitted jobs, from Slurm. Exits 1 when a step failed."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from pipeline import cli, config
from pipeline.config import PipelineConfig
from pipeline.core.paths import RunPaths
from pipeline.orchestration.status import describe, is_failed


def show(cfg: PipelineConfig) -> int:
    saved = RunPaths.of(cfg.workdir).config
    if saved.exists():  # the run's own config, not this command's defaults
        cfg = config.read(saved)
    rows = describe(cfg)
    print(f"Run folder: {RunPaths.of(cfg.workdir).root}")
    width = max(len(r[0]) for r in rows)
    for name, state, detail in rows:
        print(f"  {name:<{width}}  {state:<12}  {detail}")
    return 1 if any(is_failed(state) for _, state, _ in rows) else 0


@hydra.main(config_path=cli.CONF, config_name="config", version_base=None)
def main(composed: DictConfig) -> None:
    cli.run(composed, show)


if __name__ == "__main__":
    main()
