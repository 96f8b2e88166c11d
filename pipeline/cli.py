"""What every command line shares. Hydra composes the config from conf/ and the overrides;
`run` turns it into the typed config once (validated, derived values filled in), hands it to
the command, and reports a user's mistake in one line, without a traceback:

    exit 2  a config value (the message starts with the key)
    exit 3  the run folder is in use by another launcher
    exit 1  a step failed for a reason its message explains (out of space, say)
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from omegaconf import DictConfig

from pipeline import config
from pipeline.config import PipelineConfig
from pipeline.config.compose import CONF
from pipeline.core import files
from pipeline.core.errors import ConfigError, RunLocked, StageError
from pipeline.core.paths import RunPaths
from pipeline.orchestration import history, sweep

__all__ = ["CONF", "run", "fail"]

EXIT_FAILED, EXIT_CONFIG, EXIT_LOCKED = 1, 2, 3

config.register()  # before Hydra composes: conf/config.yaml starts from the schema


def fail(message: str, code: int) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)


def given() -> list[str]:
    """The overrides of this command line (of this point, in a sweep)."""
    return sweep.overrides()


def replayed(composed: DictConfig, overrides: list[str], last_stages: bool) -> DictConfig:
    """The config of a run folder that has a history: the overrides its outputs were made
    with, then this command line's (pipeline.orchestration.history); with `last_stages`, the
    stages of the run's last launch unless given."""
    multirun = sweep.is_multirun()
    paths = RunPaths.of(sweep.point_folder() if multirun else composed.workdir)
    prepared = composed.data.prepared or (composed.workdir if multirun else None)
    replay = history.to_compose(paths, prepared, overrides)
    stages = history.last_stages(paths) if last_stages else None
    if stages and not any(history.key_of(o) == "stages" for o in overrides):
        replay = [*(replay or overrides), f"stages=[{','.join(stages)}]"]
    return composed if replay is None else config.recompose(replay)


def run(
    composed: DictConfig,
    command: Callable[[PipelineConfig], int | None],
    adjust: Callable[[PipelineConfig], PipelineConfig] | None = None,
    replay: list[str] | None = None,
    last_stages: bool = False,
) -> None:
    """Type, adjust, validate and resolve the composed config (composed again on top of the
    run's history with `replay`, this command line's overrides; see `replayed`), then run
    `command` on it; exit with its code, or with one line for a user's mistake."""
    logging.getLogger("megatron").setLevel(logging.WARNING)  # its per-file INFO lines drown ours
    try:
        if replay is not None:
            composed = replayed(composed, replay, last_stages)
        code = command(config.load(composed, adjust))
    except ConfigError as e:
        fail(str(e), EXIT_CONFIG)
    except RunLocked as e:
        fail(str(e), EXIT_LOCKED)
    except StageError as e:
        fail(str(e), EXIT_FAILED)
    except Exception as e:
        cause = files.space_error(e)  # out of space somewhere no step named the file
        if cause is None:
            raise
        fail(files.out_of_space_message(cause, cause.filename or "the run folder"), EXIT_FAILED)
    if code:
        sys.exit(code)
