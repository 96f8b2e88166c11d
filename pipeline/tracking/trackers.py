"""The trackers a run has enabled (logging.wandb.mode, logging.mlflow.enabled), opened on the
logging rank. One that is off is never imported; one that is on but not installed, or that
fails, costs one warning and the run goes on without it: a tracker never stops a training."""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import Any

from pipeline.config import PipelineConfig
from pipeline.config.choices import WandbMode
from pipeline.core import files, log
from pipeline.core.paths import RunPaths
from pipeline.tracking import identity

_log = log.get()
PACKAGES = {"wandb": "wandb", "mlflow": "mlflow-skinny"}  # or the project's tracking extra


def wanted(cfg: PipelineConfig) -> dict[str, str]:
    """The trackers enabled, each with the key that enables it."""
    found = {}
    if cfg.logging.wandb.mode != WandbMode.disabled:
        found["wandb"] = f"logging.wandb.mode={cfg.logging.wandb.mode}"
    if cfg.logging.mlflow.enabled:
        found["mlflow"] = "logging.mlflow.enabled=true"
    return found


def files_to_send(paths: RunPaths) -> list[Path]:
    """What a run sends at the end of a job: the report, its loss plot and summary.json."""
    named = [paths.report, paths.report_html, paths.summary, paths.train_dir / "loss.png"]
    return [p for p in named if p.exists()]


def _numbers(record: dict[str, Any]) -> dict[str, float]:
    """What TensorBoard receives of a record too: its numbers (finite ones: trackers refuse
    NaN, and a skipped step's loss is one)."""
    return {
        k: v
        for k, v in record.items()
        if k != "step" and isinstance(v, (int, float)) and math.isfinite(v)
    }


class Trackers:
    """The tracker runs of one job, each of which goes on in the tracker run of its run
    folder; every call reaches each of them, and one that fails is dropped."""

    def __init__(self, opened: list[Any], paths: RunPaths | None = None) -> None:
        self.opened, self.paths = opened, paths
        # each tracker's last step of each key: a step it holds is never sent again (the
        # tokens of a step's validation, a killed attempt's steps that a resume does again)
        self.held: dict[int, dict[str, int]] = {id(t): {} for t in opened}

    @classmethod
    def open(cls, cfg: PipelineConfig, paths: RunPaths) -> Trackers:
        """The enabled trackers, each continuing the tracker run of this run folder."""
        enabled = wanted(cfg)
        if not enabled:
            return cls([], paths)
        saved = files.read_json_or_none(paths.tracking) or {}
        opened = []
        for name, setting in enabled.items():
            module = importlib.import_module(f"pipeline.tracking.{name}_run")
            try:
                tracker, saved[name] = module.start(cfg, paths, saved.get(name))
            except ImportError as e:
                if (e.name or "").split(".")[0] != name:
                    raise
                _log.warning(
                    f"{setting}: {name} is not installed (pip install {PACKAGES[name]}); "
                    "going on without"
                )
                continue
            except Exception as e:  # a tracker never stops the run
                _log.warning(f"{setting}: {name} failed to start ({_said(e)}); going on without")
                continue
            opened.append(tracker)
        if opened:
            files.write_json(paths.tracking, saved)
        return cls(opened, paths)

    def _each(self, what: str, *args: Any) -> None:
        for tracker in list(self.opened):
            self._call(tracker, what, *args)

    def _call(self, tracker: Any, what: str, *args: Any) -> None:
        try:
            getattr(tracker, what)(*args)
        except Exception as e:  # one warning, then the run goes on without it
            _log.warning(f"{tracker.name}: {what} failed ({_said(e)}); no more logging to it")
            self.opened.remove(tracker)

    def log(self, record: dict[str, Any]) -> None:
        step = record["step"]
        values = _numbers(record)
        for tracker in list(self.opened):
            held = self.held[id(tracker)]
            fresh = {k: v for k, v in values.items() if held.get(k, -1) < step}
            if fresh:
                held.update(dict.fromkeys(fresh, step))
                self._call(tracker, "log", fresh, step)

    def already_hold(self, records: list[dict[str, Any]]) -> None:
        """What a killed attempt logged past the step this one resumes from: each tracker run
        it went on in holds those steps already, and is not sent them again. A tracker that
        can say what it holds (MLflow) says; of another (W&B), `records` tell."""
        logged: dict[str, int] = {}
        for record in records:
            for key in _numbers(record):
                logged[key] = max(logged.get(key, -1), record["step"])
        for tracker in list(self.opened):
            if not tracker.continued or not logged:
                continue
            held = logged
            if hasattr(tracker, "holds"):
                try:
                    held = tracker.holds(set(logged))
                except Exception as e:  # one warning, then the run goes on without it
                    _log.warning(
                        f"{tracker.name}: holds failed ({_said(e)}); no more logging to it"
                    )
                    self.opened.remove(tracker)
                    continue
            mine = self.held[id(tracker)]
            mine.update({k: max(step, mine.get(k, -1)) for k, step in held.items()})

    def results(self, evaluation: dict) -> None:
        """The test results of each evaluated set, at the checkpoint's step."""
        values = {}
        for name, measured in evaluation.get("sets", {}).items():
            values.update({f"{name}/{k}": v for k, v in _numbers(measured).items()})
        if self.opened and values:
            self._each("results", values, evaluation["checkpoint_step"])

    def finish(self, artifacts: bool = True) -> None:
        """The run's identity as it is now (this job's nodes, the markers it wrote), the
        report, its plot and summary.json (with `artifacts`), then close each tracker run."""
        if self.opened and self.paths is not None:
            self._each("identify", identity.identity(self.paths))
            found = files_to_send(self.paths) if artifacts else []
            if found:
                self._each("upload", found)
        self._each("close")
        self.opened = []


def _said(e: Exception) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
