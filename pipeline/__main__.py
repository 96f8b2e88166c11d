"""`python -m pipeline [overrides]` (`make pretrain`): compose the config, check it, print the
plan, then run or submit every step that is not complete (pipeline.orchestration.launch)."""

from __future__ import annotations

import functools
import sys

import hydra
from omegaconf import DictConfig

from pipeline import cli, usage
from pipeline.core import log
from pipeline.orchestration import launch, sweep
from pipeline.orchestration.slurm_queue import slurm_answers

_log = log.get("pipeline")


@hydra.main(config_path=cli.CONF, config_name="config", version_base=None)
def main(composed: DictConfig) -> None:
    given = cli.given()
    adjust = sweep.point_config if sweep.is_multirun() else None
    cli.run(composed, functools.partial(launch.launch, given=given), adjust, replay=given)


def choose_cluster(argv: list[str]) -> None:
    """With no cluster named where a Slurm controller answers (a login node), submit to Slurm."""
    if not any(arg.startswith(("cluster=", "+cluster=")) for arg in argv) and slurm_answers():
        argv.append("cluster=slurm")
        _log.info("Slurm answers here: cluster=slurm (pass cluster=local to run here)")


if __name__ == "__main__":
    log.take_quiet(sys.argv)  # -q: warnings and errors only
    usage.answer_help("pipeline", sys.argv[1:])
    sys.argv[1:] = cli.check_overrides(sys.argv[1:])
    choose_cluster(sys.argv)
    main()
