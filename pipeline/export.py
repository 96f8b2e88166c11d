"""`python -m pipeline.export workdir=DIR [eval.checkpoint=best|latest|PATH] [out=DIR]`: a run's
checkpoint as a Hugging Face model folder with its tokenizer, in this process on the CPU (the
export stage does the same as a job: stages=[...,export]). The run's settings come from its
history, as for pipeline.status; `out=DIR` is short for export.out=DIR."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from pipeline import cli, usage
from pipeline.config import PipelineConfig
from pipeline.core import log
from pipeline.core.errors import ConfigError
from pipeline.core.paths import RunPaths
from pipeline.exporting.steps import EXPORT, folder

_log = log.get("pipeline")


def export(cfg: PipelineConfig) -> None:
    if not RunPaths.of(cfg.workdir).checkpoints.is_dir():
        raise ConfigError(f"workdir: {cfg.workdir} holds no checkpoints to export")
    if EXPORT.is_complete(cfg):
        _log.info(f"export: already complete ({folder(cfg)})")
        return
    EXPORT.run(cfg)


def main() -> None:
    log.take_quiet(sys.argv)  # -q: warnings and errors only
    usage.answer_help("pipeline.export", sys.argv[1:])
    sys.argv[1:] = [f"export.{a}" if a.startswith("out=") else a for a in sys.argv[1:]]
    sys.argv[1:] = cli.check_overrides(sys.argv[1:])

    @hydra.main(config_path=cli.CONF, config_name="config", version_base=None)
    def run(composed: DictConfig) -> None:
        cli.run(composed, export, replay=cli.given())

    run()


if __name__ == "__main__":
    main()
