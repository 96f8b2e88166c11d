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

__all__ = ["CONF", "run", "fail"]

EXIT_FAILED, EXIT_CONFIG, EXIT_LOCKED = 1, 2, 3

config.register()  # before Hydra composes: conf/config.yaml starts from the schema


def fail(message: str, code: int) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)


def run(
    composed: DictConfig,
    command: Callable[[PipelineConfig], int | None],
    adjust: Callable[[PipelineConfig], PipelineConfig] | None = None,
) -> None:
    """Type, adjust, validate and resolve the composed config, then run `command` on it; exit
    with its code, or with one line for a user's mistake."""
    logging.getLogger("megatron").setLevel(logging.WARNING)  # its per-file INFO lines drown ours
    try:
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
