"""The downstream tasks' data, settled before any job is submitted: compute nodes often have no
network, so on a machine that has it the data of eval.harness_tasks is fetched once into
eval.cache_dir (WORKDIR/eval/cache), which the jobs read offline; without network, one line
names the tasks whose data is missing. Tasks of eval.task_paths bring their own data."""

from __future__ import annotations

import socket

from pipeline.config import PipelineConfig
from pipeline.core import log
from pipeline.core.errors import ConfigError

_log = log.get("pipeline")
HUB = ("huggingface.co", 443)  # where the harness's task data comes from


def has_network(timeout_s: float = 3.0) -> bool:
    try:
        socket.create_connection(HUB, timeout=timeout_s).close()
    except OSError:
        return False
    return True


def scores_tasks(cfg: PipelineConfig) -> bool:
    """This command starts jobs that score the tasks: the downstream step, or training with
    eval.harness_every."""
    during = "train" in cfg.stages and cfg.eval.harness_every > 0
    return bool(cfg.eval.harness_tasks) and ("evaluate" in cfg.stages or during)


def check(cfg: PipelineConfig) -> bool:
    """Refuse, in one line, tasks whose data is missing where it cannot be fetched; True when
    some is missing and this machine can fetch it (`fetch`, once the run folder is held)."""
    if not scores_tasks(cfg):
        return False
    from pipeline.evaluation import downstream  # torch: only for a run that scores tasks

    missing = downstream.missing_task_data(cfg)
    if not missing:
        return False
    if has_network():
        return True
    raise ConfigError(
        f"eval.harness_tasks: no data for {', '.join(missing)} in {downstream.task_cache(cfg)}, "
        "and no network here to fetch it: launch once from a machine with network (a login "
        "node), or give the tasks with their data in eval.task_paths"
    )


def fetch(cfg: PipelineConfig) -> None:
    """The missing data fetched into the task cache; what could not be is refused in one line."""
    from pipeline.evaluation import downstream

    cache = downstream.task_cache(cfg)
    _log.info(f"downstream: fetching the data of eval.harness_tasks into {cache}")
    still = downstream.fetch_task_data(cfg, cache)
    if still:
        raise ConfigError(
            f"eval.harness_tasks: the data of {', '.join(still)} could not be fetched into "
            f"{cache} (the lines above say why); nothing was submitted"
        )
