"""What every command line shares. Hydra composes the config from conf/ and the overrides;
`run` turns it into the typed config once (checked, derived values filled in), hands it to
the command, and reports a user's mistake in one line, without a traceback:

    exit 2  a config value (the message starts with the key)
    exit 3  the run folder is in use by another launcher
    exit 1  a step failed for a reason its message explains (out of space, say)
    exit 130  interrupted (Ctrl-C) outside training (training saves first, then stops)
    exit 143  SIGTERM outside training, likewise

PIPELINE_DEBUG=1 prints the traceback behind the line.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import os
import re
import signal
import sys
import traceback
import typing
from collections.abc import Callable

from omegaconf import DictConfig

from pipeline import config
from pipeline.config import PipelineConfig, overrides, renames
from pipeline.config.compose import CONF, not_a_choice
from pipeline.core import files, interrupts, log
from pipeline.core.errors import ConfigError, RunLocked, StageError, Terminated
from pipeline.core.paths import RunPaths
from pipeline.orchestration import history, sweep
from pipeline.planning import auto

_log = log.get()

__all__ = ["CONF", "run", "fail"]

EXIT_FAILED, EXIT_CONFIG, EXIT_LOCKED, EXIT_INTERRUPTED, EXIT_TERMINATED = 1, 2, 3, 130, 143

config.register()  # before Hydra composes: conf/config.yaml starts from the schema


def fail(message: str, code: int) -> None:
    """One line for the user, and exit; with PIPELINE_DEBUG=1, the traceback before it."""
    if os.environ.get("PIPELINE_DEBUG") == "1" and sys.exc_info()[0] is not None:
        traceback.print_exc()
    _log.error(f"error: {message}")
    sys.exit(code)


# The run folder's recorded overrides put before this command line's (see check_overrides)
_context: list[str] = []


def check_overrides(args: list[str]) -> list[str]:
    """Compose the config for these command-line overrides before Hydra runs the command,
    and turn what Hydra would report in several lines (a key that is not a setting, a value of
    the wrong type, a config group option that does not exist) into one line naming the key,
    exit 2. Hydra's own options (-m, --config-dir, ...) leave the check to Hydra.

    Returns the overrides Hydra is to compose: `args`, or, where they only make sense on top of
    the run folder's own (data.sources.web.weight=0.5 on a mixture run, whose sources exist
    only with the data=mixture and +data.sources.NAME=... its launch recorded), those first,
    then `args`, as a rerun composes them anyway (history.to_compose); `given` leaves them out.

    A renamed key's old name is given its new one, with a warning (sweeps too). Every
    override, sweep or not, is then made one Hydra can read (pipeline.config.overrides);
    every point of a sweep (-m) is composed and checked before the first point runs."""
    args = renamed(args)
    at = overrides.positions(args)
    options = [arg for i, arg in enumerate(args) if i not in at]
    try:  # Hydra's options first: it reads the overrides as one run of arguments
        args = [overrides.for_hydra(args[i]) for i in at]
    except ConfigError as e:
        fail(str(e), EXIT_CONFIG)
    # a sweep composed from conf/ alone (another config dir or name: Hydra checks each point)
    if options and all(arg in overrides.MULTIRUN for arg in options):
        check_sweep_points(args)
    if options:
        return [*options, *args]
    problem = _composition_problem(args)
    if problem is None:
        return args
    context = _run_context(args)
    if context and _composition_problem([*context, *args]) is None:
        _context[:] = context
        return [*context, *args]
    fail(problem, EXIT_CONFIG)
    return args


def check_sweep_points(args: list[str]) -> None:
    """Each point of a sweep composed and checked as its run will be (on the base run's
    settings, see `_run_context`), before any point runs: an invalid one stops the sweep in
    one line naming its key and the point."""
    from pipeline.orchestration import launch

    for point in sweep.points([a for a in args if not history.key_of(a).startswith("hydra")]):
        composed, problem = _composed([*_run_context(point), *point])
        if composed is not None:
            try:
                as_point = functools.partial(sweep.point_config, point=point)
                launch.refusals(config.load(composed, as_point, settle=auto.settle))
            except ConfigError as e:
                problem = str(e)
        if problem:
            varied = " ".join(o for o in point if o not in args)
            fail(f"{problem} (sweep point {varied}; no point has run)", EXIT_CONFIG)


def renamed(args: list[str]) -> list[str]:
    """The command line with each renamed key's new name (pipeline.config.renames), one
    warning line for each old name."""
    return renames.overrides(args, renames.warn_once)


def _composition_problem(args: list[str]) -> str | None:
    """One line naming the key, when conf/ with `args` does not compose."""
    return _composed(args)[1]


def _composed(args: list[str]) -> tuple[DictConfig | None, str | None]:
    """conf/ composed with `args`, or one line naming the key when it does not compose."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=CONF, version_base=None):
            return compose("config", overrides=args), None
    except (HydraException, OmegaConfBaseException) as e:
        chain = [str(e)]
        while e.__cause__ is not None:  # the details (the key, the type) are in the causes
            e = e.__cause__
            chain.append(str(e))
        return None, overrides_problem("\n\x00".join(chain))


def _run_context(args: list[str]) -> list[str]:
    """The overrides the run folder of this command line recorded, less those it sets again."""
    workdir = next((a.split("=", 1)[1] for a in args if history.key_of(a) == "workdir"), None)
    if workdir is None:  # the default, runs/<model name>, from the model the line names
        from hydra import compose, initialize_config_dir

        models = [a for a in args if history.key_of(a).split(".")[0] == "model"]
        try:
            with initialize_config_dir(config_dir=CONF, version_base=None):
                workdir = compose("config", overrides=models).workdir
        except Exception:  # a mistake in those: the first composition's line says it
            return []
    recorded = history.recorded(RunPaths.of(workdir))
    again = history.set_again(args)
    return [o for o in recorded if history.key_of(o) not in again]


def overrides_problem(message: str) -> str:
    """Hydra's or OmegaConf's message about an override, as one line starting with the key."""
    full_key = re.search(r"full_key: (\S+)", message)
    key = full_key[1] if full_key else None
    if not_a_choice(message):
        return not_a_choice(message)
    if key and "not in" in message:
        return f"{key}: not a setting of this pipeline{_nearest(key)}"
    converted = re.search(r"Value '(.*)' of type '\w+' could not be converted to (\w+)", message)
    if key and converted:
        return f"{key}: {converted[1]!r} is not a valid {converted[2].lower()}"
    merging = re.search(r"Error merging override ([^=\s]+)=(.*)", message)
    if key and merging and "is not a ListConfig, list or tuple" in message:
        return f"{key}: give a list, in brackets: {key}=[{merging[2]}]"
    ambiguous = re.search(r"Ambiguous value for argument '([^=']+)=([^']*)'", message)
    if ambiguous:
        name, value = ambiguous[1], ambiguous[2]
        return (  # quoted twice: the shell takes the outer quotes, Hydra the inner ones
            f"{name}: {value} reads as a sweep over values; give a list in brackets "
            f"({name}=[{value}]), or one value quoted for the shell and for Hydra "
            f"(\"{name}='{value}'\")"
        )
    group = re.search(r"Could not find '([^/']+)/([^']+)'", message)
    if group:
        options = re.findall(r"^\t(\S+)$", message, re.M)
        listed = f" (one of: {', '.join(options)})" if options else ""
        return f"{group[1]}: there is no {group[1]} config named {group[2]!r}{listed}"
    # the most specific line: the last cause's first line
    causes = [c for c in message.split("\n\x00") if c.strip()]
    detail = causes[-1].strip().splitlines()[0] if causes else message
    return f"{key + ': ' if key else ''}{detail}"


def _nearest(key: str) -> str:
    """'; did you mean train.steps?' for train.stepz, from the schema's keys (a renamed key's
    old name suggests its new one)."""
    depth = key.count(".")
    known = [
        k for k in [*_schema_keys(PipelineConfig, ""), *renames.RENAMED] if k.count(".") == depth
    ]
    near = difflib.get_close_matches(key, known, n=1)
    return f"; did you mean {renames.RENAMED.get(near[0], near[0])}?" if near else ""


def _schema_keys(schema: type, prefix: str) -> list[str]:
    keys = []
    for name, hint in typing.get_type_hints(schema).items():
        keys.append(f"{prefix}{name}")
        if dataclasses.is_dataclass(hint):
            keys.extend(_schema_keys(hint, f"{prefix}{name}."))
    return keys


def given() -> list[str]:
    """The overrides of this command line (of this point, in a sweep), without the run's own
    that check_overrides put before them."""
    return sweep.overrides()[len(_context) :]


def replayed(composed: DictConfig, overrides: list[str], last_stages: bool) -> DictConfig:
    """The config of a run folder that has a history: the overrides its outputs were made
    with, then this command line's (pipeline.orchestration.history); with `last_stages`, the
    stages of the run's last launch unless given."""
    multirun = sweep.is_multirun()
    paths = RunPaths.of(sweep.point_folder() if multirun else composed.workdir)
    prepared = composed.data.prepared or (composed.workdir if multirun else None)
    base = sweep.base_run() if multirun else None  # a point starts from its base run
    replay = history.to_compose(paths, prepared, overrides, base)
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
    """Type, adjust, check and resolve the composed config (composed again on top of the
    run's history with `replay`, this command line's overrides; see `replayed`), then run
    `command` on it; exit with its code, or with one line for a user's mistake."""
    logging.getLogger("megatron").setLevel(logging.WARNING)  # its per-file INFO lines drown ours
    interrupts.install()  # training records Ctrl-C and SIGTERM itself instead, then saves
    code = None  # a sweep point that fails returns with its line said
    try:
        if replay is not None:
            composed = replayed(composed, replay, last_stages)
        code = command(config.load(composed, adjust, settle=auto.settle))
        interrupts.check()  # a stop that something on the way swallowed
    except SystemExit:
        raise
    except BaseException as e:
        stopped = _stopped(e)
        if stopped is not None:
            interrupts.settle()
            fail(*stopped)
        elif isinstance(e, ConfigError):
            _point_fails(str(e), EXIT_CONFIG)
        elif isinstance(e, RunLocked):
            _point_fails(str(e), EXIT_LOCKED)
        elif isinstance(e, StageError):
            _point_fails(str(e), EXIT_FAILED)
        else:
            cause = files.space_error(e) if isinstance(e, Exception) else None
            if cause is None:  # out of space somewhere no step named the file, or a bug
                raise
            message = files.out_of_space_message(cause, cause.filename or "the run folder")
            _point_fails(message, EXIT_FAILED)
    if code:
        sys.exit(code)


STOPPED = "complete outputs are kept; rerun the same command to go on"


def _stopped(e: BaseException) -> tuple[str, int] | None:
    """The line and exit code of a command stopped by Ctrl-C or SIGTERM: the exception they
    raised, or any other once one has come (an import they cut short fails as ImportError)."""
    received = interrupts.received()
    if isinstance(e, KeyboardInterrupt) or received == signal.SIGINT:
        return f"interrupted (Ctrl-C): {STOPPED}", EXIT_INTERRUPTED
    if isinstance(e, Terminated) or received == signal.SIGTERM:
        return f"terminated (SIGTERM): {STOPPED}", EXIT_TERMINATED
    return None


def _point_fails(message: str, code: int) -> None:
    """`fail`; in a sweep, the point's failure recorded in its folder and the other points
    run on (the sweep's summary lists it, and the sweep exits 1)."""
    if not sweep.is_multirun():
        fail(message, code)
    _log.error(f"error: {message}")
    sweep.record_failure(RunPaths.of(sweep.point_folder()), message)
