"""What a tracker run is told about the run it tracks: the composed config as flat parameters,
the code's version, the fingerprints the run folder's markers record, and its Slurm jobs and
nodes. Nothing here reads the environment: no secret can reach a tracker through it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

from pipeline.config import PipelineConfig
from pipeline.core import files
from pipeline.core.paths import RunPaths

PACKAGE = Path(__file__).resolve().parents[1]


def flat_config(cfg: PipelineConfig) -> dict[str, Any]:
    """{"train.lr": 0.0003, "data.inputs": '["a.jsonl"]', ...}: scalars as they are, the rest
    as JSON."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for name, inner in value.items():
                walk(f"{prefix}.{name}" if prefix else str(name), inner)
        elif value is None or isinstance(value, (bool, int, float, str)):
            out[prefix] = value
        else:
            out[prefix] = json.dumps(value, default=str)

    walk("", dataclasses.asdict(cfg))
    return out


def git_commit() -> str | None:
    """The commit of the package's checkout, if it is one (an installed wheel has none)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(PACKAGE), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def fingerprints(paths: RunPaths) -> dict[str, str]:
    """The fingerprint each completion marker of the run folder records, by step."""
    markers = {
        "tokenize": paths.manifest,
        "index": paths.index_done,
        "train": paths.train_done,
        "evaluate": paths.eval_done,
    }
    found = {}
    for step, marker in markers.items():
        record = files.read_json_or_none(marker) or {}
        if record.get("fingerprint"):
            found[step] = record["fingerprint"]
    return found


def jobs_and_nodes(paths: RunPaths) -> dict[str, str]:
    """The Slurm job ids of the run's submissions, the nodes its training ran on."""
    out = {}
    submissions = files.read_json_or_none(paths.jobs) or []
    jobs = sorted({j for s in submissions for ids in s.get("jobs", {}).values() for j in ids})
    if jobs:
        out["slurm.jobs"] = ",".join(jobs)
    attempts = (files.read_json_or_none(paths.ranks) or {}).get("attempts", [])
    nodes = sorted({r["node"] for a in attempts for r in a.get("ranks", []) if "node" in r})
    if nodes:
        out["nodes"] = ",".join(nodes)
    return out


def identity(paths: RunPaths) -> dict[str, str]:
    """Tags of the tracker run: workdir, commit, fingerprints, Slurm jobs and nodes."""
    tags = {"workdir": str(paths.root)}
    commit = git_commit()
    if commit:
        tags["git.commit"] = commit
    tags.update({f"fingerprint.{k}": v for k, v in fingerprints(paths).items()})
    tags.update(jobs_and_nodes(paths))
    return tags


def sweep_group(paths: RunPaths) -> str | None:
    """A sweep point's group: its base run folder's name and a digest of the sweep folder
    (points are <workdir>/sweep/<point>), the same for every point of one sweep."""
    if not paths.sweep_point.exists():
        return None
    sweep = paths.root.parent
    digest = hashlib.sha256(str(sweep).encode()).hexdigest()[:8]
    return f"{sweep.parent.name}-sweep-{digest}"


def sweep_folder(paths: RunPaths) -> Path | None:
    return paths.root.parent if paths.sweep_point.exists() else None
