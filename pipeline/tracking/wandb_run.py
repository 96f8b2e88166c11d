"""logging.wandb.mode: a Weights & Biases run per run folder, resumed by the id tracking.json
keeps. Offline, it writes under WORKDIR/wandb/ for `wandb sync` from a node with internet."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from pipeline.config import PipelineConfig
from pipeline.core import log
from pipeline.core.paths import RunPaths
from pipeline.tracking import identity

_log = log.get()


def sync_command(paths: RunPaths) -> str:
    """Uploads every offline attempt of the run, in order, into its one W&B run."""
    return f"wandb sync {paths.root / 'wandb'}/offline-run-*"


class WandbTracker:
    name = "W&B"

    def __init__(self, run: Any, paths: RunPaths, continued: bool) -> None:
        self.run, self.paths = run, paths
        self.continued = continued  # an earlier job's run, which holds what that job logged
        self.offline = run.settings.mode == "offline"

    def log(self, values: dict[str, float], step: int) -> None:
        # "step" as the x-axis, not W&B's own counter: a checkpoint's times arrive after
        # later steps, which W&B's counter would drop
        self.run.log({**values, "step": step})

    def results(self, values: dict[str, float], step: int) -> None:
        self.run.summary.update({**values, "checkpoint_step": step})

    def identify(self, tags: dict[str, str]) -> None:
        self.run.config.update(tags, allow_val_change=True)

    def upload(self, found: list[Path]) -> None:
        import wandb

        artifact = wandb.Artifact(f"report-{self.run.id}", type="report")
        for path in found:
            artifact.add_file(str(path), name=str(path.relative_to(self.paths.root)))
        self.run.log_artifact(artifact)

    def close(self) -> None:
        self.run.finish()
        if self.offline:
            _log.info(f"W&B run saved offline; upload it: {sync_command(self.paths)}")


def start(cfg: PipelineConfig, paths: RunPaths, saved: dict | None) -> tuple[WandbTracker, dict]:
    import wandb

    w = cfg.logging.wandb
    run_id = (saved or {}).get("id") or secrets.token_hex(6)  # W&B ids: [a-z0-9]
    group = w.group or identity.sweep_group(paths)
    common = dict(
        project=w.project,
        entity=w.entity,
        group=group,
        tags=list(w.tags) or None,
        name=paths.root.name,
        id=run_id,
        resume="allow",
        dir=str(paths.root),
        config={**identity.flat_config(cfg), **identity.identity(paths)},
        # the console is the job's log already; WANDB_INIT_TIMEOUT bounds a server's silence
        settings=wandb.Settings(
            silent=True, console="off", disable_git=True, allow_val_change=True
        ),
    )
    try:
        run = wandb.init(mode=str(w.mode), **common)
    except Exception as e:  # online, and no answer (no network, no key): the same run, offline
        if str(w.mode) != "online":
            raise
        said = (str(e).strip().splitlines() or [""])[0][:200]
        _log.warning(
            f"logging.wandb.mode=online: W&B did not start ({type(e).__name__}: {said}); "
            f"logging offline, upload later: {sync_command(paths)}"
        )
        wandb.teardown()  # the service still holds the run that did not start
        run = wandb.init(mode="offline", **common)
    run.define_metric("step")
    run.define_metric("*", step_metric="step")
    entry = {"id": run_id, "project": w.project, "entity": w.entity, "group": group}
    return WandbTracker(run, paths, continued=bool((saved or {}).get("id"))), entry
